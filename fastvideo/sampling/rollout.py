"""Group rollout: SDE sampling of FLUX with every latent and log-probability kept.

Each prompt is expanded to a group of G = num_generations samples; samples are processed
rollout_batch_size at a time (a smaller last chunk is fine). Sample k of prompt p has the global
sample id p * G + k (p = the prompt's global id), and every random draw is addressed by that id,
so the trajectories do not depend on rollout_batch_size, world size or device.

Shapes: P prompts, B = P * G samples, N = sampling_steps, L = (h/16)(w/16) tokens,
C = 64 packed channels, Lt text tokens, D T5 width, P' CLIP pooled width.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass, field, fields
from typing import Callable, Sequence

import torch

from fastvideo import platform
from fastvideo.models import flux
from fastvideo.sampling import sde, solvers
from fastvideo.sampling.plan import DPM, ODE, SDE, SamplingPlan, full_sde_plan
from fastvideo.sampling.randomness import RandomSource


@dataclass(frozen=True, kw_only=True)
class RolloutConfig:
    """How to sample. ``quantize_timestep`` passes the transformer floor(1000 sigma) / 1000 as
    upstream DanceGRPO does (the published curves used it); False passes sigma itself, as
    diffusers' FluxPipeline does. The SDE step always uses the exact sigma."""

    height: int
    width: int
    sampling_steps: int
    eta: float
    shift: float
    guidance_scale: float = 3.5
    num_generations: int
    rollout_batch_size: int
    init_same_noise: bool
    quantize_timestep: bool = True
    # With init_same_noise, compute a plan's leading ODE transitions once per group (their states
    # are the same for the group's G samples): SamplingPlan.shared_prefix.
    share_ode_prefix: bool = True

    def __post_init__(self):
        problems = []
        for name in ("height", "width", "sampling_steps", "num_generations", "rollout_batch_size"):
            if int(getattr(self, name)) < 1:
                problems.append(f"{name} must be >= 1 (got {getattr(self, name)})")
        if self.height % 16 or self.width % 16:
            problems.append(f"height and width must be multiples of 16 for FLUX (got {self.height}x{self.width})")
        if self.eta < 0:
            problems.append(f"eta must be >= 0 (got {self.eta}); 0 gives the deterministic ODE sampler")
        if self.shift <= 0:
            problems.append(f"shift must be > 0 (got {self.shift})")
        if problems:
            raise ValueError("invalid rollout configuration: " + "; ".join(problems))


@dataclass
class Trajectory:
    """Everything the reward and update phases need from one rollout, on the rollout device
    (ids on the CPU: they address random draws, which are made on the CPU).

    latents [B, N+1, L, C] float32: x_0 (initial noise) .. x_N; transition k is
        latents[:, k] -> latents[:, k+1] at sigmas[k] -> sigmas[k+1].
    log_probs [B, N] float32: log p(x_{k+1} | x_k) under the rollout policy (zeros if eta = 0).
    sigmas [N+1] float32; x0 [B, L, C] float32, the last step's x0 prediction; images
        [B, 3, H, W] float32 in [0, 1] decoded from x0 (None until decoded, see decode_images); prompt_embeds [B, Lt, D]; pooled [B, P']; text_ids [Lt, 3];
        image_ids [L, 3]; sample_ids [B] int64 (global); group_ids [B] int64 (global prompt id);
        captions: B strings.
    """

    latents: torch.Tensor
    log_probs: torch.Tensor
    sigmas: torch.Tensor
    x0: torch.Tensor
    images: torch.Tensor | None
    prompt_embeds: torch.Tensor
    pooled: torch.Tensor
    text_ids: torch.Tensor
    image_ids: torch.Tensor
    sample_ids: torch.Tensor
    group_ids: torch.Tensor
    captions: list[str] = field(default_factory=list)
    plan: SamplingPlan | None = None  # the schedule sampled with; None: every transition SDE (DanceGRPO)
    shared_prefix: int = 0  # leading transitions computed once per group (RolloutConfig.share_ode_prefix)

    # Fields indexed by sample; the others are shared by all samples.
    PER_SAMPLE = ("latents", "log_probs", "x0", "images", "prompt_embeds", "pooled", "sample_ids", "group_ids")

    @property
    def num_samples(self) -> int:
        return self.latents.shape[0]

    @property
    def num_steps(self) -> int:
        return self.log_probs.shape[1]

    def rollout_forward_samples(self) -> int:
        """Transformer forwards (in samples) that produced this trajectory: the shared prefix once
        per group, the rest once per sample."""
        groups = int(torch.unique(self.group_ids).numel())
        return self.shared_prefix * groups + (self.num_steps - self.shared_prefix) * self.num_samples

    def subset(self, index: Sequence[int] | torch.Tensor) -> "Trajectory":
        """The samples at ``index`` (a list of ints or a CPU int64 tensor), in that order."""
        idx = torch.as_tensor(index, dtype=torch.long).cpu()
        values = {}
        for f in fields(self):
            value = getattr(self, f.name)
            if f.name in self.PER_SAMPLE and value is not None:
                value = value[idx.to(value.device)]
            elif f.name == "captions":
                value = [value[i] for i in idx.tolist()]
            values[f.name] = value
        return Trajectory(**values)


def _model_dtype(module: torch.nn.Module) -> torch.dtype:
    dtype = getattr(module, "dtype", None)
    return dtype if isinstance(dtype, torch.dtype) else next(module.parameters()).dtype


def predict_velocity(
    transformer: torch.nn.Module,
    latents: torch.Tensor,
    sigma: torch.Tensor | float,
    prompt_embeds: torch.Tensor,
    pooled: torch.Tensor,
    text_ids: torch.Tensor,
    image_ids: torch.Tensor,
    guidance_scale: float = 3.5,
    quantize_timestep: bool = True,
) -> torch.Tensor:
    """FLUX velocity v(x, sigma) float32 [B, L, C] for latents [B, L, C].

    sigma: a float, a 0-d tensor or per-sample [B] (the update phase mixes timesteps).
    prompt_embeds [B, Lt, D], pooled [B, P'], text_ids [Lt, 3], image_ids [L, 3].
    The transformer gets timestep = floor(1000 sigma) / 1000 when quantize_timestep (upstream),
    else sigma (diffusers), and guidance = guidance_scale per sample (FLUX.1-dev's guidance
    embedding; there is no classifier-free guidance). Pure tensor ops: no host synchronisation.
    """
    b = latents.shape[0]
    if prompt_embeds.shape[0] != b or pooled.shape[0] != b:
        raise ValueError(
            f"batch sizes differ: latents {b}, prompt_embeds {prompt_embeds.shape[0]}, pooled {pooled.shape[0]}"
        )
    sig = torch.as_tensor(sigma, dtype=torch.float32, device=latents.device)
    sig = sig.expand(b) if sig.ndim == 0 else sig.reshape(b)
    # Same float32 arithmetic as upstream's int(sigma * 1000) / 1000 (sigma > 0, so floor == int).
    timestep = torch.floor(sig * 1000.0) / 1000.0 if quantize_timestep else sig
    guidance = torch.full((b,), float(guidance_scale), dtype=torch.float32, device=latents.device)
    dtype = _model_dtype(transformer)
    out = transformer(
        hidden_states=latents.to(dtype),
        encoder_hidden_states=prompt_embeds.to(dtype),
        pooled_projections=pooled.to(dtype),
        timestep=timestep,
        img_ids=image_ids,
        txt_ids=text_ids,
        guidance=guidance,
        return_dict=False,
    )[0]
    return out.float()


def _group_and_sample_ids(group_ids, num_prompts: int, num_generations: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Global ids on the CPU: group ids [B] (each prompt's id G times) and sample ids [B]."""
    gids = torch.as_tensor(group_ids, dtype=torch.long).cpu().reshape(-1)
    if gids.numel() != num_prompts:
        raise ValueError(f"group_ids has {gids.numel()} entries for {num_prompts} prompts; give one global id per prompt")
    if len(set(gids.tolist())) != num_prompts or bool((gids < 0).any()):
        raise ValueError(
            f"group_ids must be distinct non-negative global prompt ids (got {gids.tolist()}); equal ids would "
            "give different prompts the same noise"
        )
    per_sample_group = gids.repeat_interleave(num_generations)
    sample_ids = per_sample_group * num_generations + torch.arange(num_generations).repeat(num_prompts)
    return per_sample_group, sample_ids


def _check_text_inputs(prompt_embeds, pooled, text_ids, captions) -> None:
    if prompt_embeds.ndim != 3 or pooled.ndim != 2:
        raise ValueError(
            f"prompt_embeds must be [P, Lt, D] and pooled [P, P'], got {tuple(prompt_embeds.shape)} and "
            f"{tuple(pooled.shape)}"
        )
    num_prompts = prompt_embeds.shape[0]
    if pooled.shape[0] != num_prompts or len(captions) != num_prompts:
        raise ValueError(
            f"{num_prompts} prompt embeddings but {pooled.shape[0]} pooled embeddings and {len(captions)} captions"
        )
    if tuple(text_ids.shape) != (prompt_embeds.shape[1], 3):
        raise ValueError(f"text_ids must be [Lt={prompt_embeds.shape[1]}, 3], got {tuple(text_ids.shape)}")


def _sample_chunk(transformer, noise, step_eps, plan: SamplingPlan, sigmas, embeds, pooled, txt_ids, img_ids,
                  cfg: RolloutConfig, first: int = 0, stop: int | None = None):
    """Run the plan's transitions first .. stop-1 (default: all n) for one chunk of b samples.

    noise [b, L, C]: the state at transition ``first``; step_eps: {k: [b, L, C]} for the plan's
    SDE transitions; sigmas: the plan's sigmas on the device [n + 1]. Returns latents
    [b, stop-first+1, L, C], log_probs [b, stop-first] (zeros on ODE and DPM transitions, which
    have no density) and the last step's x0 prediction [b, L, C] (the input if the last step is
    not run). The loop never reads a value back to the host, so an accelerator runs it without
    stalls.
    """
    x = noise
    latents, log_probs = [x], []
    x0 = x
    n = plan.num_steps
    stop = n if stop is None else stop
    uses_dpm = DPM in plan.kinds
    # Multistep DPM-Solver history: the model outputs (x0 or eps, plan.dpm_algorithm) of the
    # transitions so far, newest last, with their sigmas. A DPM step right after SDE steps reads
    # the SDE steps' outputs too (upstream does so with --flow_grpo_sampling and under
    # --dpm_apply_strategy all). Host-side sigmas: the order choice never syncs the device.
    history, host_sigmas = [], plan.sigmas.tolist()
    for k in range(first, stop):
        v = predict_velocity(
            transformer, x, sigmas[k], embeds, pooled, txt_ids, img_ids, cfg.guidance_scale, cfg.quantize_timestep
        )
        kind = plan.kinds[k]
        if k == n - 1:
            # Decode from x0_hat, as upstream does. With eta > 0 this is not the last SDE sample
            # (nor its mean, which is x0_hat - eta^2/2 * eps_hat at sigma_next = 0); with eta = 0
            # the Euler step to sigma = 0 gives x0_hat exactly.
            x0 = sde.x0_prediction(x, v, sigmas[k])
        if uses_dpm:
            history = (history + [(solvers.dpm_model_output(x, v, host_sigmas[k], plan.dpm_algorithm),
                                   host_sigmas[k])])[-3:]
        if kind == SDE:
            x, log_prob = _sde_transition(plan, x, v, sigmas, k, cfg.eta, noise=step_eps.get(k))
        elif kind == ODE:
            x, log_prob = sde.sde_step(x, v, sigmas[k], sigmas[k + 1], 0.0)
        else:
            x = solvers.dpm_multistep(x, history, host_sigmas[k + 1], plan.dpm_order, k, n, plan.dpm_algorithm,
                                      plan.dpm_solver_type)
            log_prob = torch.zeros(x.shape[0], dtype=torch.float32, device=x.device)
        latents.append(x)
        log_probs.append(log_prob)
    return torch.stack(latents, dim=1), torch.stack(log_probs, dim=1), x0


def _sde_transition(plan: SamplingPlan, x, v, sigmas, k, eta, noise=None, prev_sample=None):
    """Transition k of an SDE step of the plan's kind -> (sample, log_prob [B])."""
    return sde_transition(plan.sde_kind, x, v, sigmas[k], sigmas[k + 1], eta, plan.sigmas[1], noise, prev_sample)


def sde_transition(sde_kind, x, v, sigma, sigma_next, eta, sigma_max, noise=None, prev_sample=None):
    """DanceGRPO's SDE step (sde.sde_step, called exactly as before plans existed), Flow-GRPO's, or
    a first-order SDE-DPM-Solver++ step (no eta: the solver fixes its noise)."""
    if sde_kind == "dance":
        return sde.sde_step(x, v, sigma, sigma_next, eta, noise=noise, prev_sample=prev_sample)
    if sde_kind in solvers.DPM_SDE_KINDS:
        return solvers.dpm_sde_step(x, v, sigma, sigma_next, noise=noise, prev_sample=prev_sample)
    return solvers.flow_sde_step(x, v, sigma, sigma_next, eta, float(sigma_max), noise=noise, prev_sample=prev_sample)


@torch.no_grad()
def rollout(
    transformer: torch.nn.Module,
    vae: torch.nn.Module,
    prompt_embeds: torch.Tensor,
    pooled: torch.Tensor,
    text_ids: torch.Tensor,
    captions: Sequence[str],
    group_ids: Sequence[int] | torch.Tensor,
    cfg: RolloutConfig,
    randomness: RandomSource,
    iteration: int,
    device: torch.device | str,
    autocast_dtype: torch.dtype | None = None,
    decode: bool = True,
    on_chunk: Callable[[slice, torch.Tensor], None] | None = None,
    plan: SamplingPlan | None = None,
) -> Trajectory:
    """Sample G = cfg.num_generations images per prompt with log-probabilities.

    prompt_embeds [P, Lt, D], pooled [P, P'], text_ids [Lt, 3], captions P strings,
    group_ids [P] global prompt ids (distinct across ranks). Returns a Trajectory of
    B = P * G samples, group-major (the G samples of prompt p are rows p*G .. p*G+G-1).
    With cfg.init_same_noise the G samples of a group share their initial noise (drawn under the
    group id); step noise is always per sample. autocast_dtype (e.g. torch.bfloat16) wraps the
    transformer and VAE in platform.autocast; the SDE maths stays float32. decode=False leaves
    ``images`` None so the caller can time decoding separately (decode_images).
    on_chunk(rows, x0) is called after each chunk is sampled, with the chunk's rows of the batch
    (a slice) and its x0 predictions [b, L, C], so the caller can decode and score that chunk
    while the next one samples (see fastvideo.training.reward_pipeline).
    plan: which transitions are SDE / ODE / DPM-Solver++ and their sigmas (fastvideo.sampling.plan);
    None samples every one of the cfg.sampling_steps transitions with the SDE (DanceGRPO) and
    leaves ``traj.plan`` None. Step noise is drawn only for SDE transitions, addressed by index.
    """
    _check_text_inputs(prompt_embeds, pooled, text_ids, captions)
    device = torch.device(device)
    num_prompts, G, N = prompt_embeds.shape[0], cfg.num_generations, cfg.sampling_steps
    group_of_sample, sample_ids = _group_and_sample_ids(group_ids, num_prompts, G)
    noise_ids = group_of_sample if cfg.init_same_noise else sample_ids

    lat_h, lat_w = flux.latent_hw(cfg.height, cfg.width, flux.vae_scale_factor(vae.config))
    # DDP/FSDP wrappers keep the diffusers model (and its config) under .module.
    in_channels = getattr(transformer, "module", transformer).config.in_channels
    tokens_shape = ((lat_h // 2) * (lat_w // 2), in_channels)
    run_plan = plan if plan is not None else full_sde_plan(N, cfg.shift, N, 1)
    sigmas = run_plan.sigmas.to(device)
    sde_steps = [k for k, kind in enumerate(run_plan.kinds) if kind == SDE]
    img_ids = flux.image_ids(lat_h, lat_w, device=device)
    txt_ids = text_ids.to(device)
    embeds = prompt_embeds.to(device).repeat_interleave(G, dim=0)
    pooled_b = pooled.to(device).repeat_interleave(G, dim=0)
    amp = platform.autocast(device, autocast_dtype) if autocast_dtype is not None else contextlib.nullcontext()

    all_latents, all_log_probs, all_x0 = [], [], []
    batch = num_prompts * G
    prefix = run_plan.shared_prefix() if (cfg.init_same_noise and cfg.share_ode_prefix and G > 1) else 0
    if prefix:
        # The group's G samples share their initial noise and the prefix is deterministic, so run
        # it once per prompt: [P, prefix+1, L, C] states, expanded to the samples below.
        prompt_rows = torch.arange(num_prompts) * G
        heads = []
        for start in range(0, num_prompts, cfg.rollout_batch_size):
            rows = prompt_rows[start:start + cfg.rollout_batch_size]
            noise = randomness.initial_noise(iteration, noise_ids[rows], tokens_shape).to(device)
            with amp:
                heads.append(_sample_chunk(transformer, noise, {}, run_plan, sigmas, embeds[rows.to(device)],
                                           pooled_b[rows.to(device)], txt_ids, img_ids, cfg, stop=prefix)[0])
        prefix_states = torch.cat(heads).repeat_interleave(G, dim=0)  # [B, prefix+1, L, C]
    for start in range(0, batch, cfg.rollout_batch_size):
        rows = slice(start, min(batch, start + cfg.rollout_batch_size))
        # All draws for the chunk are made on the CPU up front, then copied once.
        if prefix:
            noise = prefix_states[rows, -1]
        else:
            noise = randomness.initial_noise(iteration, noise_ids[rows], tokens_shape).to(device)
        step_eps = {}
        # SDE-DPM-Solver steps ignore eta (upstream): they always need their noise
        if sde_steps and (cfg.eta > 0 or run_plan.sde_kind in solvers.DPM_SDE_KINDS):
            eps = torch.stack([randomness.step_noise(iteration, sample_ids[rows], k, tokens_shape) for k in sde_steps])
            step_eps = dict(zip(sde_steps, eps.to(device)))
        with amp:
            lat, logp, x0 = _sample_chunk(
                transformer, noise, step_eps, run_plan, sigmas, embeds[rows], pooled_b[rows], txt_ids, img_ids, cfg,
                first=prefix,
            )
        if prefix:
            lat = torch.cat([prefix_states[rows, :-1], lat], dim=1)
            logp = torch.cat([torch.zeros(lat.shape[0], prefix, dtype=logp.dtype, device=logp.device), logp], dim=1)
        all_x0.append(x0)
        if on_chunk is not None:
            on_chunk(rows, x0)
        all_latents.append(lat)
        all_log_probs.append(logp)

    traj = Trajectory(
        latents=torch.cat(all_latents),
        log_probs=torch.cat(all_log_probs),
        sigmas=sigmas,
        x0=torch.cat(all_x0),
        images=None,
        prompt_embeds=embeds,
        pooled=pooled_b,
        text_ids=txt_ids,
        image_ids=img_ids,
        sample_ids=sample_ids,
        group_ids=group_of_sample,
        captions=[c for c in captions for _ in range(G)],
        plan=plan,
        shared_prefix=prefix,
    )
    if decode:
        traj.images = decode_images(vae, traj.x0, cfg, device, autocast_dtype)
    return traj


@torch.no_grad()
def decode_images(
    vae: torch.nn.Module,
    x0: torch.Tensor,
    cfg: RolloutConfig,
    device: torch.device | str,
    autocast_dtype: torch.dtype | None = None,
) -> torch.Tensor:
    """Packed x0 predictions [B, L, C] -> images [B, 3, H, W] float32 in [0, 1], decoded
    rollout_batch_size at a time (the VAE's activations dominate memory at full size)."""
    device = torch.device(device)
    lat_h, lat_w = flux.latent_hw(cfg.height, cfg.width, flux.vae_scale_factor(vae.config))
    amp = platform.autocast(device, autocast_dtype) if autocast_dtype is not None else contextlib.nullcontext()
    chunks = []
    with amp:
        for start in range(0, x0.shape[0], cfg.rollout_batch_size):
            chunks.append(flux.decode_latents(vae, x0[start:start + cfg.rollout_batch_size], lat_h, lat_w))
    return torch.cat(chunks)
