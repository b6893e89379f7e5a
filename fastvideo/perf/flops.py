"""Analytic FLOP counts for GRPO: one transformer forward (the model family's count), one VAE
decode, one iteration.

Conventions (the usual ones for model FLOP utilisation):
- a matmul [m, k] x [k, n] costs 2*m*n*k FLOPs; element-wise work (norms, activations, RoPE,
  softmax, residual adds, the SDE maths) is not counted — it is < 1 % of the total here and
  torch.utils.flop_counter.FlopCounterMode does not count it either;
- attention costs 4 * B * Lq * Lkv * (heads * head_dim): Q K^T and A V;
- a backward pass costs twice the forward pass (input and weight gradients), minus the input
  gradients nobody needs (the first layers, whose inputs are data);
- gradient checkpointing (diffusers checkpoints every transformer block) re-runs the blocks'
  forward once more during backward. That work is counted separately: "model FLOPs" exclude
  it (MFU), "hardware FLOPs" include it (HFU).

The transformer's per-layer count is the family's (ModelFamily.transformer_flops, e.g.
fastvideo.models.flux.flops); the AutoencoderKL decoder's follows diffusers 0.32 exactly; tests/perf
checks both against FlopCounterMode on the tiny and small presets.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Callable, Mapping

from fastvideo.models.flops import attention_flops, linear_flops  # noqa: F401 (re-exported)


def image_tokens_for(height: int, width: int, vae_scale: int = 8, patch: int = 2) -> int:
    """Packed image tokens: (h / 16) * (w / 16) for FLUX (VAE /8, then 2x2 patches)."""
    step = vae_scale * patch
    if height % step or width % step:
        raise ValueError(f"image size {height}x{width} must be a multiple of {step} on both sides")
    return (height // step) * (width // step)


# ----------------------------------------------------------------------------- VAE decoder


def conv2d_flops(c_in: int, c_out: int, kernel: int, h_out: int, w_out: int, batch: int = 1) -> int:
    return 2 * batch * c_in * c_out * kernel * kernel * h_out * w_out


def _resnet_flops(c_in: int, c_out: int, h: int, w: int, B: int) -> int:
    """ResnetBlock2D: two 3x3 convs, plus a 1x1 shortcut when the width changes."""
    shortcut = conv2d_flops(c_in, c_out, 1, h, w, B) if c_in != c_out else 0
    return conv2d_flops(c_in, c_out, 3, h, w, B) + conv2d_flops(c_out, c_out, 3, h, w, B) + shortcut


def _family(family):
    """``family``'s cost-model role; None: the reference model's family (FLUX.1-dev's, --model_family's default)."""
    from fastvideo.models.base import require_cost_model
    from fastvideo.models.registry import DEFAULT_FAMILY, get_model_family

    return require_cost_model(family if family is not None else get_model_family(DEFAULT_FAMILY))


def vae_decoder_flops(vae_cfg: Mapping | None, latent_h: int, latent_w: int, batch: int = 1) -> int:
    """FLOPs of AutoencoderKL.decode on a [B, C, latent_h, latent_w] latent (diffusers' Decoder:
    conv_in, mid block = resnet + single-head attention + resnet, up blocks of layers_per_block+1
    resnets with a nearest x2 upsample + 3x3 conv after all but the last, conv_out). vae_cfg None:
    the default family's reference VAE."""
    cfg = dict(_family(None).reference_vae_config if vae_cfg is None else vae_cfg)
    chans = list(cfg["block_out_channels"])
    n_res = int(cfg.get("layers_per_block", 2)) + 1
    zc, B = int(cfg.get("latent_channels", 16)), int(batch)
    h, w = int(latent_h), int(latent_w)
    top = chans[-1]
    total = conv2d_flops(zc, zc, 1, h, w, B) if cfg.get("use_post_quant_conv", True) else 0
    total += conv2d_flops(zc, top, 3, h, w, B)
    total += 2 * _resnet_flops(top, top, h, w, B)
    if cfg.get("mid_block_add_attention", True):
        n = h * w  # one head of width `top` over all latent pixels; q, k, v and out projections
        total += 4 * linear_flops(B * n, top, top) + attention_flops(B, n, n, top)
    c_prev = top
    for i, c in enumerate(reversed(chans)):
        for j in range(n_res):
            total += _resnet_flops(c_prev if j == 0 else c, c, h, w, B)
        c_prev = c
        if i < len(chans) - 1:
            h, w = 2 * h, 2 * w
            total += conv2d_flops(c, c, 3, h, w, B)
    total += conv2d_flops(chans[0], int(cfg.get("out_channels", 3)), 3, h, w, B)
    return total


# ----------------------------------------------------------------------------- one GRPO iteration


@dataclass(frozen=True)
class IterationShape:
    """What one GRPO iteration does, over all ranks together.

    samples = world_size * prompts_per_rank * num_generations images are rolled out with
    sampling_steps transformer forwards each (no grad), decoded once each, and each trains on
    trained_steps transitions (forward + backward, + a block recompute under checkpointing).
    """

    height: int = 720
    width: int = 720
    text_tokens: int = 512
    sampling_steps: int = 16
    num_generations: int = 12
    prompts_per_rank: int = 1
    world_size: int = 16
    trained_steps: int = 9
    gradient_checkpointing: bool = True
    # No-grad update forwards per trained (sample, step) besides the one with gradients: NFT's
    # old-policy prediction (1), a KL reference's (+1); 0 for GRPO without KL.
    nograd_update_forwards: int = 0
    # --bestofn K: each prompt's K best-of-n samples train (all num_generations are rolled out); 0: all
    bestofn: int = 0

    @property
    def image_tokens(self) -> int:
        return image_tokens_for(self.height, self.width)

    @property
    def samples(self) -> int:
        return self.world_size * self.prompts_per_rank * self.num_generations

    @property
    def trained_samples(self) -> int:
        """The samples the update trains: all, or K a prompt under --bestofn K."""
        return self.world_size * self.prompts_per_rank * (self.bestofn or self.num_generations)

    def __post_init__(self) -> None:
        for name in ("text_tokens", "sampling_steps", "num_generations", "prompts_per_rank", "world_size"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1 (got {getattr(self, name)})")
        if not 0 <= self.trained_steps <= self.sampling_steps:
            raise ValueError(f"trained_steps {self.trained_steps} must be in [0, sampling_steps={self.sampling_steps}]")
        if self.bestofn and (self.bestofn % 2 or not 2 <= self.bestofn <= self.num_generations):
            raise ValueError(f"bestofn {self.bestofn} must be 0 or even in [2, num_generations={self.num_generations}]")
        image_tokens_for(self.height, self.width)  # fails early on a bad size


@dataclass(frozen=True)
class IterationFlops:
    """FLOPs of one GRPO iteration by phase (all ranks together)."""

    rollout: int  # sampling_steps x samples transformer forwards, no grad
    update_forward: int  # trained_steps x samples forwards with grad
    update_backward: int  # their backward
    recompute: int  # checkpointed blocks re-run in backward (0 without checkpointing)
    vae_decode: int  # one decode per sample
    update_nograd: int = 0  # the update's no-grad forwards (NFT's v_old, a KL reference's v_ref)

    @property
    def model_flops(self) -> int:
        """The work the algorithm needs: everything but the checkpointing recompute (for MFU)."""
        return self.rollout + self.update_forward + self.update_backward + self.vae_decode + self.update_nograd

    @property
    def hardware_flops(self) -> int:
        """What the devices actually execute, recompute included (for HFU)."""
        return self.model_flops + self.recompute

    def as_dict(self) -> dict[str, int]:
        d = asdict(self)
        d["model_total"] = self.model_flops
        d["hardware_total"] = self.hardware_flops
        return d


def iteration_flops(shape: IterationShape, transformer=None, vae_cfg: Mapping | None = None,
                    family=None) -> IterationFlops:
    """FLOPs of one GRPO iteration (text encoders excluded: prompts are pre-embedded; reward
    model excluded: HPSv2's ViT-H/14 at 224 px is ~0.1 % of the total). transformer: its config
    (default: the family's reference model); family: default the default family."""
    family = _family(family)
    transformer = transformer if transformer is not None else family.reference_config
    L, Lt = shape.image_tokens, shape.text_tokens
    per = family.transformer_flops(transformer, L, Lt)
    fwd = per["forward"]
    trained = shape.trained_steps * shape.trained_samples
    # a family with its own decode count (the video VAEs: models/video_decode.py), else AutoencoderKL's
    decode = getattr(family, "vae_decode_flops", None)
    one = (decode(vae_cfg if vae_cfg is not None else family.reference_vae_config, transformer, shape.height,
                  shape.width) if decode is not None else vae_decoder_flops(vae_cfg, shape.height // 8, shape.width // 8))
    return IterationFlops(
        rollout=shape.sampling_steps * shape.samples * fwd,
        update_forward=trained * fwd,
        update_backward=trained * per["backward"],
        recompute=trained * per["blocks"] if shape.gradient_checkpointing else 0,
        vae_decode=shape.samples * one,
        update_nograd=shape.nograd_update_forwards * trained * fwd,
    )


@dataclass(frozen=True)
class PassCounts:
    """Transformer passes of one iteration on one rank, counted in samples and in calls.

    The rollout runs every transition of the sampling plan (SDE, ODE or DPM-Solver++ alike) for
    every sample, rollout_batch_size samples per call, except a shared ODE prefix (its first
    shared_prefix transitions, SamplingPlan.shared_prefix), run once per prompt; the update runs
    trained_steps forwards and backwards per sample, micro_batch_size samples per call.
    DanceGRPO, MixGRPO, MixGRPO-Flash and Flow-GRPO-Fast differ only in (rollout_steps,
    trained_steps, shared_prefix).
    """

    rollout_steps: int
    trained_steps: int
    samples: int
    rollout_calls: int
    update_calls: int
    shared_prefix: int = 0
    prompts: int = 0

    @property
    def rollout_forward_samples(self) -> int:
        return self.shared_prefix * self.prompts + (self.rollout_steps - self.shared_prefix) * self.samples

    @property
    def update_forward_samples(self) -> int:
        return self.trained_steps * self.samples

    @property
    def update_backward_samples(self) -> int:
        return self.trained_steps * self.samples

    def block_calls(self, num_blocks: int, gradient_checkpointing: bool) -> int:
        """Executions of transformer blocks: each call runs every block once, and once more in
        backward under gradient checkpointing."""
        return num_blocks * (self.rollout_calls + self.update_calls * (2 if gradient_checkpointing else 1))


def pass_counts(rollout_steps: int, trained_steps: int, samples: int, rollout_batch_size: int,
                micro_batch_size: int, shared_prefix: int = 0, prompts: int = 0) -> PassCounts:
    """The analytic pass counts for one rank's iteration (see PassCounts); ``prompts`` is needed
    with a shared prefix."""
    if shared_prefix and not prompts:
        raise ValueError("a shared ODE prefix is run once per prompt: give prompts")
    return PassCounts(
        rollout_steps=rollout_steps, trained_steps=trained_steps, samples=samples,
        rollout_calls=(math.ceil(prompts / rollout_batch_size) * shared_prefix
                       + math.ceil(samples / rollout_batch_size) * (rollout_steps - shared_prefix)),
        update_calls=math.ceil(samples / micro_batch_size) * trained_steps,
        shared_prefix=shared_prefix, prompts=prompts,
    )


def plan_steps(sampling_steps: int, candidates: int, num_trained: int, *, window: int = 0, window_start: int = 0,
               dpm_post_ratio: float | None = None) -> tuple[int, int]:
    """(rollout transformer forwards per sample, trained steps per sample) of a sampling plan:
    window 0 is DanceGRPO (every step SDE, num_trained of them trained); window W > 0 is MixGRPO /
    Flow-GRPO-Fast starting at window_start, with the compressed DPM-Solver++ tail (Flash) when
    dpm_post_ratio is given."""
    from fastvideo.sampling.plan import full_sde_plan, window_plan

    if window <= 0:
        plan = full_sde_plan(sampling_steps, 1.0, candidates, num_trained)
    else:
        plan = window_plan(sampling_steps, 1.0, window_start, window, candidates=candidates,
                           dpm_post_ratio=dpm_post_ratio)
    return plan.num_steps, plan.num_trained


# ----------------------------------------------------------------------------- utilisation

# Dense (no sparsity) bf16 tensor peaks per device, TFLOPS, from the vendors' data sheets.
# Matched by case-insensitive substring, most specific first. Anything else: pass the peak.
PEAK_BF16_TFLOPS: tuple[tuple[str, float], ...] = (
    ("H100 PCIe", 756.0),
    ("H100", 989.4),
    ("H800", 989.4),
    ("H200", 989.4),
    ("H20", 148.0),
    ("A100", 312.0),
    ("A800", 312.0),
    ("L40S", 362.1),
    # Ascend 910C (Atlas A3) per die; an assumption, see docs/performance.md.
    ("910C", 376.0),
    ("Ascend A3", 376.0),
)


def peak_tflops_for(device_name: str) -> float | None:
    """Dense bf16 peak (TFLOPS) for a device name like 'NVIDIA H200', or None when unknown."""
    name = (device_name or "").lower()
    for key, tflops in PEAK_BF16_TFLOPS:
        if key.lower() in name:
            return tflops
    return None


def utilisation(flops: float, seconds: float, num_devices: int, peak_tflops_per_device: float) -> float:
    """Achieved FLOP/s over peak: flops / (seconds * num_devices * peak)."""
    if seconds <= 0 or num_devices < 1 or peak_tflops_per_device <= 0:
        raise ValueError(
            f"need seconds > 0, num_devices >= 1 and a positive peak (got {seconds}, {num_devices}, "
            f"{peak_tflops_per_device})"
        )
    return flops / (seconds * num_devices * peak_tflops_per_device * 1e12)


def count_flops(fn: Callable[[], object]) -> int:
    """FLOPs torch.utils.flop_counter.FlopCounterMode counts while running fn().

    Attention is forced onto the math SDPA backend so that it is counted on every device (the
    CPU fused kernel has no FLOP formula registered and would count as zero).
    """
    from torch.nn.attention import SDPBackend, sdpa_kernel
    from torch.utils.flop_counter import FlopCounterMode

    with sdpa_kernel(SDPBackend.MATH), FlopCounterMode(display=False) as counter:
        fn()
    return int(counter.get_total_flops())


def human(flops: float) -> str:
    """1.23e+17 style, or 0."""
    if flops == 0:
        return "0"
    exp = int(math.floor(math.log10(abs(flops))))
    return f"{flops / 10 ** exp:.3f}e{exp:+03d}"
