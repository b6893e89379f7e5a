"""vlm: judges against a stand-in OpenAI-compatible server on loopback (what vLLM / SGLang serve)."""

import base64
import io
import threading
import time

import numpy as np
import pytest
import torch
from PIL import Image

from fastvideo.rewards.combine import build_multi_reward, parse_reward_spec
from fastvideo.rewards.remote import check_reward_endpoints
from fastvideo.rewards.vlm import DEFAULT_TEMPLATE, VLMJudgeError, VLMJudgeReward, parse_score
from server_utils import free_port, serve_in_thread


class StandIn:
    """Answers chat completions like a VLM endpoint: 'Final Score: <mean red value / 51>'
    computed from the image it was sent, and remembers questions and peak concurrency."""

    def __init__(self, answer=None, delay_s=0.05):
        self.answer, self.delay_s = answer, delay_s
        self.questions, self.in_flight, self.peak = [], 0, 0
        self.lock = threading.Lock()

    def app(self, model="UnifiedReward"):
        from fastapi import FastAPI

        app = FastAPI()

        @app.get("/v1/models")
        def models():
            return {"object": "list", "data": [{"id": model, "object": "model"}]}

        @app.post("/v1/chat/completions")
        def chat(body: dict):
            with self.lock:
                self.in_flight += 1
                self.peak = max(self.peak, self.in_flight)
            try:
                time.sleep(self.delay_s)
                assert body["model"] == model and body["temperature"] == 0
                image_part, text_part = body["messages"][0]["content"]
                data = base64.b64decode(image_part["image_url"]["url"].split(",", 1)[1])
                red = np.asarray(Image.open(io.BytesIO(data)).convert("RGB"))[..., 0].mean()
                with self.lock:
                    self.questions.append(text_part["text"])
                text = self.answer or f"cat (object): 1\nFinal Score: {red / 51:.4f}"
                return {"choices": [{"index": 0, "message": {"role": "assistant", "content": text}}]}
            finally:
                with self.lock:
                    self.in_flight -= 1

        return app


def _red_scores(images):
    u8 = (images * 255).round()
    return torch.tensor([round(float(x) / 51, 4) for x in u8[:, 0].mean(dim=(1, 2))])


def test_scores_parsed_in_order_with_bounded_concurrency(tmp_path):
    stand_in = StandIn()
    template = tmp_path / "judge.txt"
    template.write_text("Rate this image for the caption <<{prompt}>>. End with Final Score: N")
    images = torch.rand(6, 3, 16, 16, generator=torch.Generator().manual_seed(0))
    prompts = [f"prompt {i}" for i in range(6)]
    with serve_in_thread(stand_in.app()) as (url, _):
        spec = f"vlm:{url}/v1?model=UnifiedReward&prompt={template}:0.5"
        (entry,) = parse_reward_spec(spec)
        assert (entry.name, entry.weight) == ("vlm/UnifiedReward", 0.5)
        multi = build_multi_reward([entry], reward_kwargs={"vlm": {"concurrency": 3, "timeout_s": 10.0}})
        out = multi(images, prompts)
    torch.testing.assert_close(out.raw["vlm/UnifiedReward"], _red_scores(images), rtol=0, atol=1e-6)
    torch.testing.assert_close(out.total, 0.5 * _red_scores(images), rtol=0, atol=1e-6)
    assert 1 < stand_in.peak <= 3
    assert sorted(stand_in.questions) == sorted(f"Rate this image for the caption <<{p}>>. End with Final Score: N"
                                                for p in prompts)


def test_unparsable_answer_fails_or_uses_the_fallback(caplog):
    stand_in = StandIn(answer="I like it.")
    images = torch.rand(2, 3, 8, 8)
    with serve_in_thread(stand_in.app()) as (url, _):
        with pytest.raises(VLMJudgeError, match="no score .*I like it"):
            VLMJudgeReward(f"{url}/v1?model=UnifiedReward")(images, ["a", "b"])
        got = VLMJudgeReward(f"{url}/v1?model=UnifiedReward&fallback=0")(images, ["a", "b"])
    assert got.tolist() == [0.0, 0.0] and "using fallback" in caplog.text


def test_unreachable_or_wrong_model_fails_naming_the_url():
    dead = f"http://127.0.0.1:{free_port()}"
    with pytest.raises(VLMJudgeError, match=f"{dead}/v1 .*does not answer"):
        check_reward_endpoints(parse_reward_spec(f"vlm:{dead}/v1?model=X"), timeout_s=2)
    with serve_in_thread(StandIn().app(model="judge-7b")) as (url, _):
        with pytest.raises(VLMJudgeError, match="does not serve model 'UnifiedReward'.*judge-7b"):
            VLMJudgeReward(f"{url}/v1?model=UnifiedReward")


@pytest.mark.parametrize("answer, score", [
    ("a: 1\nFinal Score: 3.5", 3.5),
    ("final score = 4", 4.0),
    ("Final Score: 2 ... corrected. Final Score: **4.25**", 4.25),
    ("Score 5", None),
])
def test_parse_score(answer, score):
    assert parse_score(answer) == score


def test_default_template_asks_for_the_parsed_format():
    assert "{prompt}" in DEFAULT_TEMPLATE and parse_score(DEFAULT_TEMPLATE.replace("N", "3")) == 3.0
