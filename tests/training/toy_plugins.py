"""A toy model family and a toy objective, defined outside fastvideo/ through the public protocols.

Selected with ``--model_family toy_plugins:ToyFamily --algorithm toy_plugins:ToyObjective`` (this
folder on PYTHONPATH). Nothing under fastvideo/ names them: they prove that a new model family and
a new algorithm need no edit there (tests/training/test_protocol_plugins.py).

- ToyFamily: a diffusers-layout folder (model_index.json, transformer/, vae/, text_encoder/) of
  tiny ModelMixin models. Its conditioning is one text vector per prompt, made by a fixed linear
  map of the prompt's character histogram; its "VAE" maps each 2x2-patch token to pixels.
- ToyObjective: advantage-weighted flow matching on the rollouts' clean samples, with a running
  reward baseline as its own state (so an exact resume needs the objective's state_dict).

Each brings its own flags and section (fastvideo.settings): --toy_baseline_decay (ToySettings,
config.json's plugins.toy) and --toy_decode_gain (ToyFamilySettings, plugins.toy_family). Neither
reads another component's settings: the objective sees its own section and the update's micro-batch
size through its context, the family its section as ``settings``.
"""

from __future__ import annotations

import argparse
import json
from dataclasses import dataclass
from pathlib import Path

import torch
from diffusers import ConfigMixin, ModelMixin
from diffusers.configuration_utils import register_to_config
from torch import nn

from fastvideo.algorithms.base import Objective, RewardResult, Term
from fastvideo.models.base import LatentLayout, ModelFamily, StoredTensor, TensorConditioning
from fastvideo.settings import ObjectiveSettings, Settings, check_number, flag_group

PATCH = 2


class ToyBlock(nn.Module):
    def __init__(self, width: int):
        super().__init__()
        self.norm = nn.LayerNorm(width)
        self.mlp = nn.Sequential(nn.Linear(width, 2 * width), nn.GELU(), nn.Linear(2 * width, width))

    def forward(self, h):
        return h + self.mlp(self.norm(h))


class ToyTransformer(ModelMixin, ConfigMixin):
    _no_split_modules = ["ToyBlock"]

    @register_to_config
    def __init__(self, in_channels: int = 4, text_dim: int = 8, width: int = 32, num_blocks: int = 2):
        super().__init__()
        self.inp = nn.Linear(in_channels, width)
        self.text = nn.Linear(text_dim, width)
        self.time = nn.Linear(1, width)
        self.blocks = nn.ModuleList(ToyBlock(width) for _ in range(num_blocks))
        self.out = nn.Linear(width, in_channels)

    def forward(self, x, sigma, text):  # x [B, L, C], sigma [B], text [B, T]
        h = self.inp(x) + self.text(text).unsqueeze(1) + self.time(sigma.view(-1, 1).to(x.dtype)).unsqueeze(1)
        for block in self.blocks:
            h = block(h)
        return self.out(h)


class ToyVAE(ModelMixin, ConfigMixin):
    @register_to_config
    def __init__(self, latent_channels: int = 4):
        super().__init__()
        self.to_pixels = nn.Linear(latent_channels, 3 * PATCH * PATCH)


class ToyTextEncoder(ModelMixin, ConfigMixin):
    @register_to_config
    def __init__(self, bins: int = 16, text_dim: int = 8):
        super().__init__()
        self.proj = nn.Linear(bins, text_dim)


@dataclass
class ToySettings(ObjectiveSettings):
    baseline_decay: float = 0.5

    section = "toy"

    @classmethod
    def add_flags(cls, parser: argparse.ArgumentParser) -> None:
        flag_group(parser, "toy objective").add_argument(
            "--toy_baseline_decay", type=float, default=0.5, help="weight of the old reward baseline per update")

    @classmethod
    def from_args(cls, args: argparse.Namespace) -> "ToySettings":
        return cls(baseline_decay=args.toy_baseline_decay).checked()

    @classmethod
    def flags_from_resolved(cls, section: dict) -> dict:
        return {"toy_baseline_decay": section["baseline_decay"]}

    def check(self) -> None:
        check_number("toy_baseline_decay", self.baseline_decay, at_least=0.0)


@dataclass
class ToyFamilySettings(Settings):
    decode_gain: float = 1.0

    section = "toy_family"

    @classmethod
    def add_flags(cls, parser: argparse.ArgumentParser) -> None:
        flag_group(parser, "toy family").add_argument(
            "--toy_decode_gain", type=float, default=1.0, help="the toy VAE's logits are multiplied by this")

    @classmethod
    def from_args(cls, args: argparse.Namespace) -> "ToyFamilySettings":
        return cls(decode_gain=args.toy_decode_gain).checked()

    @classmethod
    def flags_from_resolved(cls, section: dict) -> dict:
        return {"toy_decode_gain": section["decode_gain"]}


def write_toy_model(root: Path, seed: int = 0) -> Path:
    """A random-weight toy model folder in the diffusers layout."""
    torch.manual_seed(seed)
    root.mkdir(parents=True, exist_ok=True)
    ToyTransformer().save_pretrained(root / "transformer")
    ToyVAE().save_pretrained(root / "vae")
    ToyTextEncoder().save_pretrained(root / "text_encoder")
    (root / "model_index.json").write_text(json.dumps({"_class_name": "ToyPipeline"}))
    return root


class ToyFamily(ModelFamily):
    name = "toy"
    export_class_name = "ToyTransformer"
    storage = (StoredTensor("text", "text_path", "text"),)
    json_keys = ("text_path", "caption")
    max_sequence_length_limit = 1024
    text_components = ("text_encoder",)
    text_encoder_components = ("text_encoder",)
    training_components = ("transformer", "vae")
    settings = ToyFamilySettings

    def __init__(self, guidance_scale: float = 0.0, quantize_timestep: bool = True,
                 settings: ToyFamilySettings | None = None, **ignored):
        self.quantize_timestep = quantize_timestep
        self.decode_gain = (settings or ToyFamilySettings()).decode_gain

    # -- loading
    def check_folder(self, path, components=None):
        root = Path(path)
        missing = [c for c in (components or ("transformer", "vae", "text_encoder"))
                   if not (root / c / "config.json").is_file()]
        if missing:
            raise self.folder_error(f"toy model folder {root} lacks {missing}")
        return root

    def transformer_class(self):
        return ToyTransformer

    def load_transformer(self, root, subfolder, device, dtype):
        folder = Path(root) / subfolder if subfolder else Path(root)
        return ToyTransformer.from_pretrained(folder, torch_dtype=dtype).to(device)

    def meta_transformer(self, config, dtype):
        with torch.device("meta"):
            return ToyTransformer.from_config(config).to(dtype)

    def adapt_for_device(self, transformer, device):
        pass

    def load_vae(self, path, device="cpu", dtype=torch.float32):
        return ToyVAE.from_pretrained(Path(path) / "vae", torch_dtype=dtype).requires_grad_(False).eval().to(device)

    def load_text_encoders(self, path, device="cpu", dtype=torch.float32):
        return ToyTextEncoder.from_pretrained(Path(path) / "text_encoder", torch_dtype=dtype).eval().to(device)

    def block_classes(self):
        return (ToyBlock,)

    # -- conditioning and storage
    @torch.no_grad()
    def encode_prompts(self, encoders, prompts, max_sequence_length=0):
        bins = encoders.config.bins
        hist = torch.stack([torch.bincount(torch.tensor([ord(c) % bins for c in p] or [0]), minlength=bins).float()
                            / max(1, len(p)) for p in prompts])
        return TensorConditioning({"text": encoders.proj(hist.to(encoders.device))})

    def cond_from_tensors(self, records):
        return TensorConditioning({"text": torch.stack([r["text"] for r in records])})

    def check_record(self, idx, record, first_dims=None, where=""):
        return record, tuple(record["text"].shape)

    def check_dims(self, dims, transformer_config, max_sequence_length=None):
        if dims != (transformer_config["text_dim"],):
            raise ValueError(f"toy text vectors {dims} do not fit text_dim {transformer_config['text_dim']}")

    def encoder_dims(self, encoders):
        return {"text_dim": encoders.config.text_dim}

    def record_shapes(self, max_sequence_length, encoder_dims):
        return ((encoder_dims["text_dim"],),)

    # -- sampling
    def layout(self, height, width, vae, transformer=None, device=None):
        channels = vae.config.latent_channels
        return LatentLayout(height, width, tokens=((height // PATCH) * (width // PATCH), channels),
                            latent_hw=(height // PATCH, width // PATCH))

    def velocity(self, transformer, x, sigma, cond, layout):
        sig = torch.as_tensor(sigma, dtype=torch.float32, device=x.device)
        sig = sig.expand(x.shape[0]) if sig.ndim == 0 else sig.reshape(x.shape[0])
        dtype = next(transformer.parameters()).dtype
        return transformer(x.to(dtype), sig, cond["text"].to(dtype)).float()

    def decode(self, vae, x0, layout):
        b, (h, w) = x0.shape[0], layout.latent_hw
        pixels = vae.to_pixels(x0.to(vae.dtype)).float()  # [B, L, 3 * P * P]
        img = pixels.view(b, h, w, 3, PATCH, PATCH).permute(0, 3, 1, 4, 2, 5).reshape(b, 3, h * PATCH, w * PATCH)
        return torch.sigmoid(self.decode_gain * img)
    # no cost-model role (models.base.FamilyCostModel): it trains; the FLOP and memory estimates refuse it


class ToyObjective(Objective):
    """Advantage-weighted flow matching: each sample's clean latent x0 is re-noised at a seeded t,
    and the squared error of the velocity to (eps - x0) is weighted by (reward - baseline). The
    baseline is a running mean of the data-parallel group's rewards: the objective's own state."""

    name = "toy"
    settings = ToySettings
    needs_log_probs = False

    def __init__(self, context):
        self.dims = context.dims
        self.device = context.device
        self.micro = context.update.train_micro_batch_size
        self.decay = context.settings.baseline_decay
        self.baseline = 0.0
        self.updates = 0

    def advantages(self, rewards: RewardResult) -> torch.Tensor:
        everything = self.dims.gather_dp(rewards.total.to(self.device)).cpu()
        adv = rewards.total - self.baseline
        self.baseline = self.decay * self.baseline + (1 - self.decay) * float(everything.mean())
        return adv

    def plan_update(self, traj, iteration: int):
        b = traj.num_samples
        return [[Term(m, torch.arange(start, min(b, start + self.micro)))]
                for m, start in enumerate(range(0, b, self.micro))]

    def loss(self, policy, traj, advantages, term, stats):
        rows = term.rows
        x0 = traj.x0[rows.to(traj.x0.device)]
        g = torch.Generator().manual_seed(1000 * self.updates + int(traj.sample_ids[rows[0]]))
        eps = torch.randn(x0.shape, generator=g).to(x0.device)
        t = torch.rand(x0.shape[0], generator=g).to(x0.device)
        x_t = (1 - t.view(-1, 1, 1)) * x0 + t.view(-1, 1, 1) * eps
        v = policy.velocity(traj, rows, x_t, t)
        err = ((v - (eps - x0)) ** 2).mean(dim=(1, 2))
        loss = (advantages[rows.to(advantages.device)] * err).mean()
        stats.add(term, {"toy_fm_error": err.detach().mean()})
        return loss

    def summarize(self, stats):
        return {"toy_fm_error": stats.mean("toy_fm_error")}, {}

    def after_update(self, policy, iteration: int) -> None:
        self.updates += 1

    def state_dict(self) -> dict:
        return {"baseline": self.baseline, "updates": self.updates}

    def load_state_dict(self, state: dict) -> None:
        self.baseline, self.updates = float(state["baseline"]), int(state["updates"])


class PromptLength:
    """A reward that depends on the prompt as well as the image (``--rewards toy_plugins:PromptLength:W``):
    the image's mean plus 0.01 per character of its prompt, so that a sample scored against another
    sample's prompt gets another score (tests/training/test_reward_pipeline.py)."""

    name = "prompt_length"

    def __init__(self, **_):
        pass

    def __call__(self, images, prompts):
        lengths = torch.tensor([len(p) for p in prompts], dtype=torch.float32)
        return images.float().mean(dim=(1, 2, 3)) + 0.01 * lengths
