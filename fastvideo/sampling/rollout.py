"""Group rollout: SDE sampling of a model family with every latent and log-probability kept.

Each prompt is expanded to a group of G = num_generations samples; samples are processed
rollout_batch_size at a time (a smaller last chunk is fine). Sample k of prompt p has the global
sample id p * G + k (p = the prompt's global id), and every random draw is addressed by that id,
so the trajectories do not depend on rollout_batch_size, world size or device.

Shapes: P prompts, B = P * G samples, N = sampling_steps, (L, C) = the family's LatentLayout.tokens
(FLUX: L = (h/16)(w/16) tokens of C = 64 packed channels).
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass, field, fields
from typing import Callable, Sequence

import torch

from fastvideo.index_copies import on
from fastvideo import devices
from fastvideo.models.base import Conditioning, LatentLayout, ModelFamily
from fastvideo.sampling import sde, solvers
from fastvideo.sampling.plan import DPM, ODE, SDE, SamplingPlan
from fastvideo.sampling.randomness import RandomSource
from fastvideo.sampling.settings import DECODE_FROM, SAME_NOISE_SCOPES, RolloutSettings  # noqa: F401  (old imports)


# The rollout's settings are the one RolloutSettings (built from the flags, or directly).
RolloutConfig = RolloutSettings


@dataclass
class Trajectory:
    """Everything the reward and update phases need from one rollout, on the rollout device
    (ids on the CPU: they address random draws, which are made on the CPU).

    latents [B, N+1, L, C] float32: x_0 (initial noise) .. x_N; transition k is
        latents[:, k] -> latents[:, k+1] at sigmas[k] -> sigmas[k+1]; None for a rollout made with
        keep_latents=False (an objective that reads only x0: Objective.needs_trajectory).
    log_probs [B, N] float32: log p(x_{k+1} | x_k) under the rollout policy (zeros if eta = 0);
        None for a rollout made with keep_log_probs=False (an objective that replays no transition's
        log-probability: Objective.needs_log_probs).
    sigmas [N+1] float32; x0 [B, L, C] float32, the last step's x0 prediction; images
        [B, 3, H, W] float32 in [0, 1] decoded from x0 (None until decoded, see decode_images);
        cond: the model family's Conditioning of the B samples; layout: the family's LatentLayout;
        sample_ids [B] int64 (global); group_ids [B] int64 (global prompt id); captions: B strings.
    """

    latents: torch.Tensor | None
    log_probs: torch.Tensor | None
    sigmas: torch.Tensor
    x0: torch.Tensor
    images: torch.Tensor | None
    cond: Conditioning
    layout: LatentLayout
    sample_ids: torch.Tensor
    group_ids: torch.Tensor
    captions: list[str] = field(default_factory=list)
    plan: SamplingPlan | None = None  # the schedule sampled with
    shared_prefix: int = 0  # leading transitions computed once per group (RolloutConfig.share_ode_prefix)

    # Fields indexed by sample; the others are shared by all samples.
    PER_SAMPLE = ("latents", "log_probs", "x0", "images", "cond", "sample_ids", "group_ids")

    @property
    def num_samples(self) -> int:
        return self.x0.shape[0]

    @property
    def num_steps(self) -> int:
        return self.sigmas.shape[0] - 1

    def nbytes(self) -> dict[str, int]:
        """Bytes this rank holds for the trajectory, by field (the stored tensors: latents, log_probs,
        x0, images, the Conditioning's tensors; None fields count 0): what perf.memory.trajectory_bytes
        models."""
        out = {name: _tensor_bytes(getattr(self, name)) for name in ("latents", "log_probs", "x0", "images")}
        out["cond"] = sum(_tensor_bytes(v) for v in self.cond.to_tensors().values())
        return out

    def rollout_forward_samples(self) -> int:
        """Transformer forwards (in samples) that produced this trajectory: the shared prefix once
        per group, the rest once per sample."""
        groups = int(torch.unique(self.group_ids).numel())
        return self.shared_prefix * groups + (self.num_steps - self.shared_prefix) * self.num_samples

    def rollout_log_prob(self, rows: torch.Tensor, steps: torch.Tensor) -> torch.Tensor:
        """[b] the rollout's log-probability of the transitions (rows[i]: steps[i] -> steps[i] + 1)."""
        return self.log_probs[on(rows, self.log_probs.device), on(steps, self.log_probs.device)]

    def subset(self, index: Sequence[int] | torch.Tensor) -> "Trajectory":
        """The samples at ``index`` (a list of ints or a CPU int64 tensor), in that order."""
        idx = torch.as_tensor(index, dtype=torch.long).cpu()
        values = {}
        for f in fields(self):
            value = getattr(self, f.name)
            if f.name == "cond":
                value = value.select(idx)
            elif f.name in self.PER_SAMPLE and value is not None:
                value = value[idx.to(value.device)]
            elif f.name == "captions":
                value = [value[i] for i in idx.tolist()]
            values[f.name] = value
        return Trajectory(**values)


def _tensor_bytes(value) -> int:
    return value.numel() * value.element_size() if isinstance(value, torch.Tensor) else 0


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


def sample_transitions(family: ModelFamily, transformer, noise, step_eps, plan: SamplingPlan, sigmas,
                       cond: Conditioning, layout: LatentLayout, eta: float, first: int = 0, stop: int | None = None,
                       keep_states: bool = True, decode_from: str = "x0_prediction", keep_log_probs: bool = True):
    """Run the plan's transitions first .. stop-1 (default: all n) for one chunk of b samples.

    noise [b, L, C]: the state at transition ``first``; step_eps: {k: [b, L, C]} for the plan's
    SDE transitions; sigmas: the plan's sigmas on the device [n + 1]; cond: the chunk's b samples.
    Returns latents [b, stop-first+1, L, C], log_probs [b, stop-first] (zeros on ODE and DPM
    transitions, which have no density) and the last step's x0 prediction [b, L, C] (the input if
    the last step is not run; decode_from "final_sample": the last transition's sample instead). keep_states=False returns None for the latents and holds no state
    beyond the current one; keep_log_probs=False None for the log-probs (none kept). The loop never reads a value back to the host, so an accelerator
    runs it without stalls. Training rollouts and evaluation both sample through it.
    """
    x = noise
    latents, log_probs = ([x] if keep_states else None), []
    x0 = x
    n = plan.num_steps
    stop = n if stop is None else stop
    uses_dpm = DPM in plan.kinds
    # Multistep DPM-Solver history: the model outputs (x0 or eps, plan.dpm_algorithm) of the
    # transitions so far, newest last, with their sigmas. A DPM step right after SDE steps reads
    # the SDE steps' outputs too (upstream does so with --flow_grpo_sampling and under
    # --dpm_apply_strategy all). Host-side sigmas: the order choice never syncs the device.
    history, host_sigmas = [], plan.host_sigmas
    for k in range(first, stop):
        v = family.velocity(transformer, x, sigmas[k], cond, layout)
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
            x, log_prob = _sde_transition(plan, x, v, sigmas, k, eta, noise=step_eps.get(k),
                                          fixed=fixed_tokens(layout))
        elif kind == ODE:
            x, log_prob = sde.sde_step(x, v, sigmas[k], sigmas[k + 1], 0.0)
        else:
            x = solvers.dpm_multistep(x, history, host_sigmas[k + 1], plan.dpm_order, k, n, plan.dpm_algorithm,
                                      plan.dpm_solver_type)
            log_prob = torch.zeros(x.shape[0], dtype=torch.float32, device=x.device)
        if keep_states:
            latents.append(x)
        if keep_log_probs:
            log_probs.append(log_prob)
    if decode_from == "final_sample" and stop == n:
        x0 = x  # Flow-GRPO decodes the SDE's last sample (noise included), not x0_hat
    return ((torch.stack(latents, dim=1) if keep_states else None),
            (torch.stack(log_probs, dim=1) if keep_log_probs else None), x0)


def _sde_transition(plan: SamplingPlan, x, v, sigmas, k, eta, noise=None, prev_sample=None, fixed: int = 0):
    """Transition k of an SDE step of the plan's kind -> (sample, log_prob [B])."""
    return sde_transition(plan.sde_kind, x, v, sigmas[k], sigmas[k + 1], eta, plan.host_sigmas[1], noise, prev_sample,
                          fixed)


def fixed_tokens(layout) -> int:
    """The leading tokens of a layout that are given, not generated ("fixed_tokens": the first latent frame
    of Wan2.2-TI2V-5B's image-to-video); 0 for none (every other layout)."""
    return int(layout.extras.get("fixed_tokens", 0)) if layout is not None else 0


def sde_transition(sde_kind, x, v, sigma, sigma_next, eta, sigma_max, noise=None, prev_sample=None, fixed: int = 0):
    """DanceGRPO's SDE step (sde.sde_step, called exactly as before plans existed), Flow-GRPO's,
    Flash-GRPO's (--algorithm flash_grpo) or a first-order SDE-DPM-Solver++ step (no eta: the
    solver fixes its noise). ``fixed`` > 0: the first ``fixed`` tokens are no action of the policy (a
    given first frame): they take the deterministic Euler step x + (sigma_next - sigma) v, no noise, and
    the log-probability [B] is the other tokens' alone (their mean, as every SDE step averages)."""
    if fixed:
        def cut(t):
            return None if t is None else t[:, fixed:]

        free, log_prob = sde_transition(sde_kind, x[:, fixed:], v[:, fixed:], sigma, sigma_next, eta, sigma_max,
                                        cut(noise), cut(prev_sample))
        head, _ = sde.sde_step(x[:, :fixed], v[:, :fixed], sigma, sigma_next, 0.0)
        return torch.cat([head, free], dim=1), log_prob
    if sde_kind == "dance":
        return sde.sde_step(x, v, sigma, sigma_next, eta, noise=noise, prev_sample=prev_sample)
    if sde_kind in solvers.DPM_SDE_KINDS:
        return solvers.dpm_sde_step(x, v, sigma, sigma_next, noise=noise, prev_sample=prev_sample)
    if sde_kind == "flash":
        return solvers.flash_sde_step(x, v, sigma, sigma_next, eta, float(sigma_max), noise, prev_sample)
    return solvers.flow_sde_step(x, v, sigma, sigma_next, eta, float(sigma_max), noise=noise, prev_sample=prev_sample)


def transition_gaussian(sde_kind, x, v, sigma, sigma_next, eta, sigma_max) -> tuple[torch.Tensor, torch.Tensor]:
    """(mean [B, ...], std broadcastable) of an SDE step of DanceGRPO's or Flow-GRPO's kind: what
    the KL term compares (SDE-DPM-Solver++ has none here: the config refuses --kl_coef with it)."""
    if sde_kind == "dance":
        return sde.step_gaussian(x, v, sigma, sigma_next, eta)
    if sde_kind in solvers.DPM_SDE_KINDS:
        raise ValueError(f"no step Gaussian for the KL term under {sde_kind!r}")
    if sde_kind == "flash":
        return solvers.flash_step_gaussian(x, v, sigma, sigma_next, eta, float(sigma_max))
    return solvers.flow_step_gaussian(x, v, sigma, sigma_next, eta, float(sigma_max))


def _after_prefix(head: torch.Tensor, lat: torch.Tensor | None, logp: torch.Tensor | None):
    """A chunk's latents and log-probs past a shared ODE prefix of ``head`` [b, prefix, L, C] states: the
    prefix's states and zero log-probs (no density) in front; None (not kept) stays None."""
    if lat is not None:
        lat = torch.cat([head, lat], dim=1)
    if logp is not None:
        logp = torch.cat([torch.zeros(logp.shape[0], head.shape[1], dtype=logp.dtype, device=logp.device), logp], dim=1)
    return lat, logp


def _cat_kept(chunks: list) -> torch.Tensor | None:
    """The chunks' tensors concatenated along the samples; None where they were not kept."""
    return None if chunks[0] is None else torch.cat(chunks)


@dataclass
class _Run:
    """What every chunk of one rollout shares (on the device)."""

    family: ModelFamily
    transformer: torch.nn.Module
    plan: SamplingPlan
    sigmas: torch.Tensor
    cond: Conditioning  # the B samples'
    layout: LatentLayout
    cfg: RolloutConfig
    amp: object


def _amp(device: torch.device, autocast_dtype):
    return devices.autocast(device, autocast_dtype) if autocast_dtype is not None else contextlib.nullcontext()


def _prefix_states(run: _Run, randomness: RandomSource, iteration: int, noise_ids, num_prompts: int, G: int,
                   prefix: int, device) -> torch.Tensor:
    """The shared ODE prefix, run once per prompt: [B, prefix+1, L, C] states (each prompt's G times).

    The group's G samples share their initial noise and the prefix is deterministic."""
    prompt_rows = torch.arange(num_prompts) * G
    heads = []
    for start in range(0, num_prompts, run.cfg.rollout_batch_size):
        rows = prompt_rows[start:start + run.cfg.rollout_batch_size]
        noise = devices.to_device(randomness.initial_noise(iteration, noise_ids[rows], run.layout.tokens), device)
        with run.amp:
            heads.append(sample_transitions(run.family, run.transformer, noise, {}, run.plan, run.sigmas,
                                            run.cond.select(rows.to(device)), run.layout, run.cfg.eta,
                                            stop=prefix)[0])
    return torch.cat(heads).repeat_interleave(G, dim=0)  # [B, prefix+1, L, C]


def initial_noise_ids(cfg: RolloutConfig, group_of_sample: torch.Tensor, sample_ids: torch.Tensor) -> torch.Tensor:
    """int64 [B]: the id each sample's initial noise is drawn under (equal ids, equal noise).

    Without init_same_noise every sample has its own. With it, scope "prompt" draws under the group
    id; scope "rank" draws every sample of the call under the first group's id, as upstream draws
    one noise before its per-sample loop (so with one prompt per rank both scopes agree)."""
    if not cfg.init_same_noise:
        return sample_ids
    if cfg.same_noise_scope == "prompt":
        return group_of_sample
    return torch.full_like(group_of_sample, int(group_of_sample[0]))


def _step_noise(run: _Run, randomness: RandomSource, iteration: int, sample_ids, device) -> dict:
    """{k: [b, L, C]} for the plan's SDE transitions, drawn on the CPU up front and copied once."""
    sde_steps = [k for k, kind in enumerate(run.plan.kinds) if kind == SDE]
    # SDE-DPM-Solver steps ignore eta (upstream): they always need their noise
    if sde_steps and (run.cfg.eta > 0 or run.plan.sde_kind in solvers.DPM_SDE_KINDS):
        draws = [randomness.step_noise(iteration, sample_ids, k, run.layout.tokens) for k in sde_steps]
        # stacked into pinned memory on an accelerator and copied without the host waiting
        eps = torch.stack(draws, out=devices.host_buffer((len(draws), *draws[0].shape), draws[0].dtype, device))
        return dict(zip(sde_steps, devices.to_device(eps, device)))
    return {}


@torch.no_grad()
def rollout(
    family: ModelFamily,
    transformer: torch.nn.Module,
    vae: torch.nn.Module,
    cond: Conditioning,
    captions: Sequence[str],
    group_ids: Sequence[int] | torch.Tensor,
    cfg: RolloutConfig,
    randomness: RandomSource,
    iteration: int,
    device: torch.device | str,
    autocast_dtype: torch.dtype | None = None,
    decode: bool = True,
    on_chunk: Callable[[slice, torch.Tensor], None] | None = None,
    *,
    plan: SamplingPlan,
    keep_latents: bool = True, keep_log_probs: bool = True,
) -> Trajectory:
    """Sample G = cfg.num_generations images per prompt with log-probabilities.

    cond: the family's Conditioning of P prompts, captions P strings, group_ids [P] global prompt
    ids (distinct across ranks). Returns a Trajectory of B = P * G samples, group-major (the G
    samples of prompt p are rows p*G .. p*G+G-1). With cfg.init_same_noise every sample of the call
    shares one initial noise (same_noise_scope "rank", upstream) or the G samples of each group do
    ("prompt"); see initial_noise_ids. Step noise is always per sample.
    autocast_dtype (e.g. torch.bfloat16) wraps the transformer and VAE in devices.autocast; the
    SDE maths stays float32. decode=False leaves ``images`` None so the caller can time decoding
    separately (decode_images). on_chunk(rows, x0) is called after each chunk is sampled, with the
    chunk's rows of the batch (a slice) and its x0 predictions [b, L, C], so the caller can decode
    and score that chunk while the next one samples (see fastvideo.training.reward_pipeline).
    plan: which transitions are SDE / ODE / DPM-Solver++ and their sigmas (fastvideo.sampling.plan;
    DanceGRPO is full_sde_plan). Step noise is drawn only for SDE transitions, addressed by index.
    keep_latents / keep_log_probs False: latents / log_probs None, all else the same (Objective.needs_trajectory /
    needs_log_probs False: NFT, AWM, DGPO keep neither).
    """
    family.check_cond(cond)
    if len(cond) != len(captions):
        raise ValueError(f"{len(cond)} prompt conditionings but {len(captions)} captions")
    device = torch.device(device)
    num_prompts, G = len(cond), cfg.num_generations
    group_of_sample, sample_ids = _group_and_sample_ids(group_ids, num_prompts, G)
    noise_ids = initial_noise_ids(cfg, group_of_sample, sample_ids)
    layout = family.layout(cfg.height, cfg.width, vae, transformer, device)
    run = _Run(family, transformer, plan, plan.sigmas.to(device), cond.to(device).repeat_interleave(G), layout, cfg,
               _amp(device, autocast_dtype))

    all_latents, all_log_probs, all_x0 = [], [], []
    batch = num_prompts * G
    prefix = plan.shared_prefix() if (cfg.init_same_noise and cfg.share_ode_prefix and G > 1) else 0
    if prefix:
        prefix_states = _prefix_states(run, randomness, iteration, noise_ids, num_prompts, G, prefix, device)
    for start in range(0, batch, cfg.rollout_batch_size):
        rows = slice(start, min(batch, start + cfg.rollout_batch_size))
        if prefix:
            noise = prefix_states[rows, -1]
        else:
            noise = devices.to_device(randomness.initial_noise(iteration, noise_ids[rows], layout.tokens), device)
        step_eps = _step_noise(run, randomness, iteration, sample_ids[rows], device)
        with run.amp:
            lat, logp, x0 = sample_transitions(family, transformer, noise, step_eps, plan, run.sigmas,
                                               run.cond.select(rows), layout, cfg.eta, first=prefix,
                                               keep_states=keep_latents, decode_from=cfg.decode_from,
                                               keep_log_probs=keep_log_probs)
        if prefix:
            lat, logp = _after_prefix(prefix_states[rows, :-1], lat, logp)
        all_x0.append(x0)
        if on_chunk is not None:
            on_chunk(rows, x0)
        all_latents.append(lat)
        all_log_probs.append(logp)

    traj = Trajectory(
        latents=_cat_kept(all_latents), log_probs=_cat_kept(all_log_probs), sigmas=run.sigmas,
        x0=torch.cat(all_x0), images=None, cond=run.cond, layout=layout, sample_ids=sample_ids,
        group_ids=group_of_sample, captions=[c for c in captions for _ in range(G)], plan=plan,
        shared_prefix=prefix,
    )
    if decode:
        traj.images = decode_images(vae, traj.x0, cfg, device, autocast_dtype, family=family, layout=layout)
    return traj


@torch.no_grad()
def decode_images(
    vae: torch.nn.Module,
    x0: torch.Tensor,
    cfg: RolloutConfig,
    device: torch.device | str,
    autocast_dtype: torch.dtype | None = None,
    *,
    family: ModelFamily,
    layout: LatentLayout | None = None,
) -> torch.Tensor:
    """Packed x0 predictions [B, L, C] -> images [B, 3, H, W] float32 in [0, 1], decoded
    rollout_batch_size at a time (the VAE's activations dominate memory at full size).
    family: the samples' ModelFamily; layout: default the family's for cfg's size."""
    device = torch.device(device)
    layout = layout if layout is not None else family.layout(cfg.height, cfg.width, vae, None, device)
    chunks = []
    with _amp(device, autocast_dtype):
        for start in range(0, x0.shape[0], cfg.rollout_batch_size):
            chunks.append(family.decode(vae, x0[start:start + cfg.rollout_batch_size], layout))
    return torch.cat(chunks)
