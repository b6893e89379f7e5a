"""VideoAlign (VideoReward, Liu et al. 2025): a Qwen2-VL-2B reward model that scores a clip with
its prompt on three heads, VQ (visual quality), MQ (motion quality) and TA (text alignment); a clip
reward (``takes_clips``): ``--rewards videoalign --videoalign_dir DIR``, in the trainer or served by
``reward_server --rewards videoalign --videoalign_dir DIR``.

The model, as upstream KwaiVGI/VideoAlign (219ab9db64c045e5181a2202d11f686439351292) builds it
(trainer.py Qwen2VLRewardModelBT, train_reward.py, utils.load_model_from_checkpoint), written here on
transformers' stock Qwen2-VL classes (both library lines): the three reward tokens are added to the
tokenizer (the embeddings resized to it), a bias-free linear head (hidden -> output_dim) reads the
last hidden state at those tokens, [B, 3, N], its diagonal when N == 3. The language model runs with
sequential positions on all three rotary axes (upstream's forward passes no position ids to
transformers 4.45's Qwen2VLModel, which then counts positions 0..L-1; Qwen2-VL's own multimodal
rope index is not used). Each head is normalised (x - mean) / std by the checkpoint's
inference_config when it has one (inference.py), and the reward is w_VQ VQ + w_MQ MQ + w_TA TA
(``--videoalign_weights``, default 1,1,1: upstream's Overall, the unweighted sum).

DIR is the released checkpoint folder (huggingface KwaiVGI/VideoReward): model_config.json and
checkpoint-N/ (model.pth, or a LoRA adapter: adapter_model.safetensors + non_lora_state_dict.pth,
merged into the weights here), the latest N unless ``checkpoint_step``; the base model
Qwen2-VL-2B-Instruct (weights, tokenizer, processor) in DIR/Qwen2-VL-2B-Instruct or ``base_dir``.
Weights load with torch.load(weights_only=True) or safetensors.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Sequence

import torch

from fastvideo.errors import MissingInputError
from fastvideo.rewards import videoalign_inputs as inputs
from fastvideo.rewards.video import ClipReward
from fastvideo.rewards.weights import default_folder, where_to_get

DEFAULT_VIDEOALIGN_DIR = default_folder("videoalign")
BASE_FOLDER = "Qwen2-VL-2B-Instruct"  # the base model's folder inside DIR
DEFAULT_CLIP_FPS = 16.0  # Wan2.1's frame rate (Wan2.2-TI2V-5B: 24)


def resolve_videoalign_files(folder: str | Path, base_dir: str | Path | None = None) -> tuple[Path, Path]:
    """(the VideoReward folder, the base model's folder), each checked for what it must hold, or one
    line naming what is missing and where to get it (the videoalign rows of rewards/weights.py)."""
    folder = Path(folder)
    base = Path(base_dir) if base_dir is not None else folder / BASE_FOLDER
    for path, what in ((folder / "model_config.json", "the VideoReward model_config.json"),
                       (base / "config.json", f"the base model ({BASE_FOLDER}) config.json")):
        if not path.is_file():
            raise MissingInputError(f"VideoAlign: {what} is not at {str(path)!r}; "
                                    f"{where_to_get('videoalign', str(folder))}")
    checkpoint_folder(folder)
    return folder, base


def read_model_config(folder: Path) -> dict:
    """DIR/model_config.json (upstream's run config: data_config, model_config, peft_lora_config,
    inference_config), checked for what scoring needs."""
    path = folder / "model_config.json"
    config = json.loads(path.read_text())
    data, model = config.get("data_config", {}), config.get("model_config", {})
    if not model.get("use_special_tokens", False) or data.get("sample_type", "uniform") != "uniform":
        raise ValueError(f"{path}: only the released VideoReward's setup is supported (use_special_tokens, "
                         f"sample_type uniform); got use_special_tokens={model.get('use_special_tokens')}, "
                         f"sample_type={data.get('sample_type')}")
    inputs.build_prompt("", data.get("prompt_template_type", "none"))  # refuses another template
    return config


def checkpoint_folder(folder: Path, step: int | None = None) -> Path:
    """DIR/checkpoint-<step>, the highest step when ``step`` is None (utils.load_model_from_checkpoint)."""
    found = {int(p.name.split("-")[-1]): p for p in folder.glob("checkpoint-*") if p.name.split("-")[-1].isdigit()}
    if not found:
        raise MissingInputError(f"VideoAlign folder {str(folder)!r} has no checkpoint-N/ folder; "
                                f"{where_to_get('videoalign', str(folder))}")
    if step is not None and step not in found:
        raise MissingInputError(f"VideoAlign folder {str(folder)!r} has no checkpoint-{step}/; it has "
                                f"{', '.join(f'checkpoint-{s}' for s in sorted(found))}")
    return found[max(found) if step is None else step]


def checkpoint_state(folder: Path, lora: dict) -> dict[str, torch.Tensor]:
    """The reward model's weights in upstream's names (transformers 4.45's Qwen2-VL layout plus
    rm_head.weight): model.pth, or the base weights' updates of a LoRA checkpoint (each adapted
    weight's W + scale B A under its own name, the non-LoRA weights as saved)."""
    full = folder / "model.pth"
    if full.is_file():
        return torch.load(full, map_location="cpu", weights_only=True)
    adapter, rest = folder / "adapter_model.safetensors", folder / "non_lora_state_dict.pth"
    if not (adapter.is_file() and rest.is_file()):
        raise MissingInputError(f"VideoAlign checkpoint {str(folder)!r} has neither model.pth nor "
                                "adapter_model.safetensors + non_lora_state_dict.pth")
    from safetensors.torch import load_file

    saved = torch.load(rest, map_location="cpu", weights_only=True)
    state = {peft_name(k): v for k, v in saved.items() if ".original_module." not in k}
    lora_weights = load_file(adapter)
    r, alpha = int(lora.get("lora_r", 8)), float(lora.get("lora_alpha", 16))
    scale = alpha / (math.sqrt(r) if lora.get("use_rslora", False) else r)
    for key, a in lora_weights.items():
        if ".lora_A." in key:
            b = lora_weights[key.replace(".lora_A.", ".lora_B.")]
            state[peft_name(key).replace(".lora_A.weight", ".weight") + "@lora"] = scale * (b.float() @ a.float())
        elif ".lora_" not in key:  # a module PEFT saved whole (modules_to_save)
            state[peft_name(key)] = a
    return state


def peft_name(name: str) -> str:
    """A PEFT model's weight name as the plain model's (its wrapper prefix and sub-module names dropped)."""
    name = name.removeprefix("base_model.model.")
    return name.replace(".modules_to_save.default.", ".").replace(".base_layer.", ".")


def to_stock_name(name: str, stock: set[str]) -> str:
    """An upstream weight name in the installed transformers' Qwen2-VL layout (transformers 5 moves
    the language model to model.language_model.* and the vision tower to model.visual.*)."""
    if name in stock:
        return name
    if name.startswith("visual.") and "model." + name in stock:
        return "model." + name
    if name.startswith("model.") and "model.language_model." + name[6:] in stock:
        return "model.language_model." + name[6:]
    raise KeyError(f"VideoAlign checkpoint weight {name!r} has no place in Qwen2VLForConditionalGeneration")


def load_weights(vlm: torch.nn.Module, head: torch.nn.Linear, state: dict[str, torch.Tensor]) -> None:
    """Put the checkpoint's weights into the stock model and the head (LoRA updates added)."""
    own = vlm.state_dict()
    stock = set(own)
    with torch.no_grad():
        for name, value in state.items():
            if name == "rm_head.weight":
                head.weight.copy_(value)
                continue
            delta = name.endswith("@lora")
            target = own[to_stock_name(name.removesuffix("@lora"), stock)]
            if target.shape != value.shape:
                raise ValueError(f"VideoAlign weight {name!r}: {list(value.shape)} in the checkpoint, "
                                 f"{list(target.shape)} in the model built from the base config")
            if delta:
                target.add_(value.to(target.dtype))
            else:
                target.copy_(value)


def vlm_parts(vlm) -> tuple[torch.nn.Module, torch.nn.Module]:
    """(vision tower, language model) of a Qwen2VLForConditionalGeneration on either library line."""
    inner = vlm.model
    return getattr(inner, "visual", None) or vlm.visual, getattr(inner, "language_model", inner)


def reward_logits(vlm, head, batch: dict, special_ids: Sequence[int]) -> torch.Tensor:
    """The rm_head logits at the three reward tokens, [B, 3] (trainer.py Qwen2VLRewardModelBT.forward)."""
    visual, language = vlm_parts(vlm)
    ids = batch["input_ids"]
    embeds = vlm.get_input_embeddings()(ids)
    video = visual(batch["pixel_values_videos"].type(visual.dtype), grid_thw=batch["video_grid_thw"])
    video = getattr(video, "pooler_output", video)  # transformers 5: merged features as pooler_output
    mask = (ids == vlm.config.video_token_id).unsqueeze(-1).expand_as(embeds)
    embeds = embeds.masked_scatter(mask, video.to(embeds.device, embeds.dtype))
    positions = torch.arange(ids.shape[1], device=ids.device).view(1, 1, -1).expand(3, ids.shape[0], -1)
    hidden = language(inputs_embeds=embeds, attention_mask=batch["attention_mask"], position_ids=positions,
                      use_cache=False)[0]
    logits = head(hidden)
    special = torch.zeros_like(ids, dtype=torch.bool)
    for token in special_ids:
        special |= ids == token
    pooled = logits[special].view(ids.shape[0], 3, -1)
    return pooled.diagonal(dim1=1, dim2=2) if pooled.shape[-1] == 3 else pooled.reshape(ids.shape[0], -1)


class VideoAlignReward(ClipReward):
    """VideoAlign's weighted, normalised VQ + MQ + TA per (clip, its prompt); float32 ``[B]``.

    Args:
        videoalign_dir: the VideoReward folder (model_config.json, checkpoint-N/).
        base_dir: Qwen2-VL-2B-Instruct's folder; default videoalign_dir/Qwen2-VL-2B-Instruct.
        weights: (w_VQ, w_MQ, w_TA) of the total; upstream's Overall is 1, 1, 1.
        clip_fps: the clips' frame rate (upstream reads it from the video file; frames are sampled
            at the checkpoint's fps of it).
        checkpoint_step: which checkpoint-N (default: the highest N).
        device, dtype, batch_size: see BatchedReward (clips per model call).
    """

    name = "videoalign"

    def __init__(self, videoalign_dir: str | Path = DEFAULT_VIDEOALIGN_DIR, base_dir: str | Path | None = None,
                 weights: Sequence[float] = (1.0, 1.0, 1.0), clip_fps: float = DEFAULT_CLIP_FPS,
                 checkpoint_step: int | None = None, device: torch.device | str = "cpu",
                 dtype: torch.dtype | None = None, batch_size: int = 8) -> None:
        super().__init__(device=device, dtype=dtype, batch_size=batch_size)
        folder, base = resolve_videoalign_files(videoalign_dir, base_dir)
        if len(weights) != 3 or not all(math.isfinite(float(w)) for w in weights):
            raise ValueError(f"VideoAlign weights are three finite numbers (VQ, MQ, TA); got {list(weights)}")
        if not clip_fps > 0:
            raise ValueError(f"VideoAlign clip_fps must be positive; got {clip_fps}")
        config = read_model_config(folder)
        self.data, self.norm = config.get("data_config", {}), config.get("inference_config")
        self.weights = torch.tensor([float(w) for w in weights])
        self.clip_fps = float(clip_fps)
        self._load(base, checkpoint_folder(folder, checkpoint_step), config)

    def _load(self, base: Path, checkpoint: Path, config: dict) -> None:
        from transformers import AutoProcessor, Qwen2VLForConditionalGeneration

        self.processor = AutoProcessor.from_pretrained(base, padding_side="right", local_files_only=True)
        tokenizer = self.processor.tokenizer
        tokenizer.add_special_tokens({"additional_special_tokens": list(inputs.SPECIAL_TOKENS)})  # appended ids
        self.special_ids = tokenizer.convert_tokens_to_ids(list(inputs.SPECIAL_TOKENS))
        vlm = Qwen2VLForConditionalGeneration.from_pretrained(base, torch_dtype=torch.float32, local_files_only=True)
        vlm.resize_token_embeddings(len(tokenizer), mean_resizing=False)  # rows: the checkpoint's
        out_dim = int(config.get("model_config", {}).get("output_dim", 3))
        head = torch.nn.Linear(vlm.config.get_text_config().hidden_size, out_dim, bias=False)
        load_weights(vlm, head, checkpoint_state(checkpoint, config.get("peft_lora_config", {})))
        self.vlm = vlm.eval().requires_grad_(False).to(self.device)
        self.head = head.eval().requires_grad_(False).to(self.device)

    def batch(self, clips: torch.Tensor, prompts: Sequence[str]) -> dict:
        """The processor's batch for clips [b, F, 3, H, W] in [0, 1] (inference.py prepare_batch)."""
        d = self.data
        nframes = d.get("num_frames")
        fps = None if nframes is not None else d.get("fps", inputs.FPS)
        videos = [inputs.clip_frames(c, self.clip_fps, fps, nframes, int(d.get("max_frame_pixels", 240 * 320)))
                  for c in clips]
        template = d.get("prompt_template_type", "detailed_special")
        text = self.processor.apply_chat_template([inputs.chat(p, template) for p in prompts], tokenize=False,
                                                  add_generation_prompt=True)
        return self.processor(text=text, videos=videos, padding=True, return_tensors="pt",
                              videos_kwargs={"do_rescale": True})

    def heads(self, clips: torch.Tensor, prompts: Sequence[str], normalise: bool = True) -> torch.Tensor:
        """[b, 3]: VQ, MQ, TA of each clip, normalised by the checkpoint's inference_config (if any)."""
        batch = {k: v.to(self.device) for k, v in self.batch(clips, prompts).items() if torch.is_tensor(v)}
        with self.autocast():
            raw = reward_logits(self.vlm, self.head, batch, self.special_ids).float().cpu()
        return normalise_heads(raw, self.norm) if normalise else raw

    def _score_clips(self, clips: torch.Tensor, prompts: Sequence[str]) -> torch.Tensor:
        return self.heads(clips, prompts) @ self.weights


def normalise_heads(raw: torch.Tensor, norm: dict | None) -> torch.Tensor:
    """(x - mean) / std per head with inference_config's VQ_mean, VQ_std, ... (none: unchanged)."""
    if norm is None:
        return raw
    mean = torch.tensor([float(norm[f"{h}_mean"]) for h in inputs.HEADS])
    std = torch.tensor([float(norm[f"{h}_std"]) for h in inputs.HEADS])
    return (raw - mean) / std

