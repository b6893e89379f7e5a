"""VLM judges behind an OpenAI-compatible chat-completions endpoint (vLLM, SGLang...), e.g.
UnifiedReward: ``--rewards "vlm:http://host:8080/v1?model=NAME&prompt=FILE:0.5"``.

For each (image, prompt) one request goes to ``<URL path>/chat/completions``:

    {"model": NAME, "temperature": 0, "max_tokens": 512,
     "messages": [{"role": "user", "content": [
         {"type": "image_url", "image_url": {"url": "data:image/png;base64,..."}},
         {"type": "text", "text": <the question>}]}]}

Editing (a run whose prompts carry source images): the judge is called with ``sources=`` and each
request carries the **source image first**, then the edited image, then the question, whose default
is then :data:`DEFAULT_EDIT_TEMPLATE` (``prompt=FILE`` replaces either). Without sources (text to
image) the request is the one above, unchanged.

The question is the template with ``{prompt}`` replaced by the image's prompt: the file given by
``prompt=FILE`` (UTF-8 text that contains ``{prompt}``), else :data:`DEFAULT_TEMPLATE`. The score
is the number after the LAST "Final Score:" in the answer (:data:`DEFAULT_PATTERN`, case
insensitive); ``pattern=REGEX`` (URL-encoded, one capture group) changes that. An answer without a
score raises, naming it, unless ``fallback=NUMBER`` is given, which is then used (and logged).

Other query options: ``max_tokens`` (512), ``image=png|jpeg`` (png: lossless; jpeg: quality 95, as
MixGRPO sent). Requests run ``--vlm_concurrency`` at a time; each waits ``--vlm_timeout`` s and is
retried ``--reward_retries`` times with backoff, as remote: requests are.
"""

from __future__ import annotations

import base64
import io
import json
import logging
import re
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Sequence
from urllib.parse import parse_qs, urlsplit, urlunsplit

import torch

from fastvideo.rewards.base import ImageBatch, as_pils, check_inputs, check_sources
from fastvideo.rewards.http import EndpointError, RemoteRewardError, call_with_retries, error_text, http_json

log = logging.getLogger(__name__)

DEFAULT_TEMPLATE = (
    "Look at the image and at the text it was generated from: \"{prompt}\".\n"
    "Judge how faithfully the image shows everything the text asks for, and how good the image "
    "looks. Answer with one short line of reasons, then a last line of the form\n"
    "Final Score: N\nwhere N is a number from 1 (poor) to 5 (excellent)."
)
DEFAULT_EDIT_TEMPLATE = (
    "The first image is a source image; the second is the result of editing it with the instruction: "
    "\"{prompt}\".\nJudge how faithfully the second image carries out the instruction while keeping what "
    "the instruction does not ask to change, and how good it looks. Answer with one short line of reasons, "
    "then a last line of the form\nFinal Score: N\nwhere N is a number from 1 (poor) to 5 (excellent)."
)
DEFAULT_PATTERN = r"final\s*score\s*[:：=]?\s*\**\s*(-?\d+(?:\.\d+)?)"


class VLMJudgeError(RemoteRewardError):
    """A judge answer without a parsable score, or a judge that cannot be reached."""


class VLMEndpointError(VLMJudgeError, EndpointError):
    """A judge that fails its start-up check: a user error (one line, exit 2)."""


def parse_score(answer: str, pattern: str = DEFAULT_PATTERN) -> float | None:
    """The number captured by the last match of pattern in answer; None if there is none."""
    matches = re.findall(pattern, answer, flags=re.IGNORECASE)
    if not matches:
        return None
    last = matches[-1]
    return float(last[0] if isinstance(last, tuple) else last)


def load_template(path: str | None) -> str:
    if path is None:
        return DEFAULT_TEMPLATE
    file = Path(path)
    if not file.is_file():
        raise FileNotFoundError(f"vlm: prompt template file {path!r} does not exist")
    text = file.read_text(encoding="utf-8")
    if "{prompt}" not in text:
        raise ValueError(f"vlm: prompt template {path!r} has no {{prompt}} placeholder for the image's prompt")
    return text


def image_data_url(image, fmt: str) -> str:
    buf = io.BytesIO()
    if fmt == "jpeg":
        image.save(buf, format="JPEG", quality=95)
    else:
        image.save(buf, format="PNG", compress_level=1)
    return f"data:image/{fmt};base64," + base64.b64encode(buf.getvalue()).decode("ascii")


def check_vlm_endpoint(url: str, timeout_s: float = 10.0) -> None:
    """GET <base>/models: the endpoint answers and serves the model named in the URL."""
    parts = urlsplit(url)
    base = urlunsplit((parts.scheme, parts.netloc, parts.path.rstrip("/"), "", ""))
    model = parse_qs(parts.query).get("model", [""])[-1]
    try:
        listing = http_json(f"{base}/models", timeout_s=timeout_s)
    except (OSError, ValueError, RemoteRewardError) as exc:  # urllib's errors, BadReplyError, ReplyLimitError
        raise VLMEndpointError(
            f"VLM judge {base} (from --rewards vlm:{url}) does not answer GET {base}/models: "
            f"{error_text(exc)}. Is the OpenAI-compatible server (vLLM, SGLang...) running there?"
        ) from None
    data = listing.get("data", [])
    served = [m.get("id") for m in data if isinstance(m, dict)] if isinstance(data, list) else []
    if model not in served:
        raise VLMEndpointError(f"VLM judge {base} does not serve model {model!r}; it serves {served}")


class VLMJudgeReward:
    """Score per (image, prompt) from a VLM judge; float32 ``[B]`` on CPU. See module doc."""

    uses_sources = True  # called with sources= (None for text to image) ...
    sources_optional = True  # ... and judges without them (rewards.base.needs_sources)

    def __init__(self, url: str, timeout_s: float = 120.0, concurrency: int = 8, retries: int = 3,
                 batch_size: int | None = None, check: bool = True) -> None:
        parts = urlsplit(url)
        query = {k: v[-1] for k, v in parse_qs(parts.query).items()}
        self.url = url
        self.base = urlunsplit((parts.scheme, parts.netloc, parts.path.rstrip("/"), "", ""))
        self.model = query.get("model", "")
        self.name = f"vlm/{self.model}"
        self.template = load_template(query.get("prompt"))
        self.edit_template = self.template if "prompt" in query else DEFAULT_EDIT_TEMPLATE
        self.pattern = query.get("pattern", DEFAULT_PATTERN)
        re.compile(self.pattern)
        self.fallback = float(query["fallback"]) if "fallback" in query else None
        self.max_tokens = int(query.get("max_tokens", 512))
        self.image_format = query.get("image", "png")
        if self.image_format not in ("png", "jpeg"):
            raise ValueError(f"vlm: image={self.image_format!r}; use png or jpeg")
        if not (timeout_s > 0 and concurrency >= 1 and retries >= 0):
            raise ValueError(f"bad judge settings: timeout_s={timeout_s}, concurrency={concurrency}, retries={retries}")
        self.timeout_s, self.concurrency, self.retries = timeout_s, concurrency, retries
        if check:
            check_vlm_endpoint(url, timeout_s=min(timeout_s, 10.0))

    def question(self, prompt: str, edit: bool = False) -> str:
        return (self.edit_template if edit else self.template).replace("{prompt}", prompt)

    def payload(self, image, prompt: str, source=None) -> dict:
        """The chat request for one image; ``source`` (editing): its source image, sent first."""
        shown = [image] if source is None else [source, image]
        content = [{"type": "image_url", "image_url": {"url": image_data_url(im, self.image_format)}} for im in shown]
        content.append({"type": "text", "text": self.question(prompt, edit=source is not None)})
        return {"model": self.model, "messages": [{"role": "user", "content": content}],
                "temperature": 0, "max_tokens": self.max_tokens}

    def _score_one(self, image, prompt: str, source=None) -> float:
        body = json.dumps(self.payload(image, prompt, source)).encode("utf-8")
        what = f"VLM judge {self.base} ({self.model})"
        reply = call_with_retries(what, lambda seconds: http_json(
            f"{self.base}/chat/completions", body, seconds, content_type="application/json"), self.retries,
            timeout_s=self.timeout_s)
        try:
            answer = reply["choices"][0]["message"]["content"]
        except (KeyError, IndexError, TypeError):
            raise VLMJudgeError(f"{what} answered without choices[0].message.content: {reply!r:.300}") from None
        score = parse_score(answer or "", self.pattern)
        if score is None:
            if self.fallback is None:
                raise VLMJudgeError(f"{what}: no score matching {self.pattern!r} in the answer {answer!r:.300} "
                                    "(add fallback=NUMBER to the vlm: URL to score such answers instead)")
            log.warning("%s: no score in the answer %.120r; using fallback %s", what, answer, self.fallback)
            score = self.fallback
        return score

    def __call__(self, images: ImageBatch, prompts: Sequence[str], sources: torch.Tensor | None = None) -> torch.Tensor:
        n = check_inputs(images, prompts)
        pils = as_pils(images)
        if sources is not None:
            check_sources(sources, n, self.name)
        shown = as_pils(sources) if sources is not None else [None] * n
        with ThreadPoolExecutor(max_workers=self.concurrency, thread_name_prefix="vlm") as pool:
            scores = list(pool.map(self._score_one, pils, list(prompts), shown))
        return torch.tensor(scores, dtype=torch.float32)

    def __repr__(self) -> str:
        return f"VLMJudgeReward({self.url!r}, concurrency={self.concurrency})"
