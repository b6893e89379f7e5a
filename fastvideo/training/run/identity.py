"""What makes a run the run it is, and the check that a resume continues the same run.

A checkpoint keeps the settings that decide which prompts, noise and rewards the next iterations
see (``run_identity``). Resuming with any of them changed would silently make a different run
while claiming to continue the old one bit for bit, so ``check_resume`` refuses it, naming every
difference with both values, before any model is loaded. ``--resume_allow_changes`` turns the
refusal into a logged list.
"""

from __future__ import annotations

from fastvideo.config import TrainConfig
from fastvideo.errors import ConfigError

# The flag (as users type it) behind each identity key, for messages.
FLAGS = {
    "seed": "--seed",
    "sampler_seed": "--sampler_seed",
    "num_generations": "--num_generations",
    "sampling_steps": "--sampling_steps",
    "shift": "--shift",
    "eta": "--eta",
    "h": "--h",
    "w": "--w",
    "rewards": "--rewards",
    "use_group": "--use_group",
    "world_size": "the number of processes / --sp_size (the data-parallel ranks)",
    "train_batch_size": "--train_batch_size",
    "use_lora": "--use_lora",
    "lora_rank": "--lora_rank",
    "lora_alpha": "--lora_alpha",
    "lora_target_modules": "--lora_target_modules",
    # the SDE window / solver (fastvideo.sampling.mix): they decide every iteration's sampling plan
    "mix_mode": "--training_strategy / --sde_steps",
    "sde_window": "--group_size / --sde_steps",
    "window_strategy": "--sample_strategy / --sde_start",
    "window_fixed_start": "--sde_start",
    "window_move_step": "--prog_overlap / --prog_overlap_step",
    "dpm_post_compress_ratio": "--dpm_algorithm_type / --dpm_post_compress_ratio",
    "sde_kind": "--flow_grpo_sampling / --dpm_apply_strategy",
    "dpm_all": "--dpm_apply_strategy",
    "dpm_algorithm": "--dpm_algorithm_type",
    "model_family": "--model_family",
    "algorithm": "--algorithm",
    "sigma_grid": "--sigma_grid",
}
# Settings added to the identity after checkpoints were first written, with the value every earlier
# run had: a checkpoint without the key is compared as if it held that value.
ADDED_KEYS = {"model_family": "flux", "algorithm": "grpo", "sigma_grid": "shifted_linspace"}


def run_identity(cfg: TrainConfig, world_size: int) -> dict:
    """The run-defining settings, JSON-able (stored in every checkpoint's extra state)."""
    r = cfg.rollout
    return {
        "seed": cfg.optim.seed,
        "sampler_seed": cfg.optim.sampler_seed,
        "num_generations": r.num_generations,
        "sampling_steps": r.sampling_steps,
        "shift": r.shift,
        "sigma_grid": r.sigma_grid,
        "eta": r.eta,
        "h": r.height,
        "w": r.width,
        "rewards": ",".join(f"{s.name}:{s.weight:g}" for s in cfg.reward.spec),
        "use_group": cfg.grpo.use_group,
        # the data-parallel ranks decide the prompts and noise; a sequence group's ranks share them
        "world_size": world_size // cfg.sp_size,
        "train_batch_size": cfg.prompts_per_rank,
        "use_lora": cfg.lora.enabled,
        **({"lora_rank": cfg.lora.rank, "lora_alpha": cfg.lora.alpha,
            "lora_target_modules": ",".join(cfg.lora.target_modules)} if cfg.lora.enabled else {}),
        **cfg.mix.identity(),
        "model_family": cfg.model.family,
        "algorithm": cfg.algorithm,
    }


def identity_differences(saved: dict, current: dict) -> list[str]:
    """One line per setting whose value differs: 'seed (--seed): checkpoint 42, this run 7'."""
    out = []
    saved = {**ADDED_KEYS, **saved}
    for key, now in current.items():
        if key in saved and saved[key] != now:
            out.append(f"{key} ({FLAGS.get(key, '--' + key)}): checkpoint {saved[key]!r}, this run {now!r}")
    return out


def check_resume(saved_extra: dict, cfg: TrainConfig, world_size: int, source: str) -> list[str]:
    """Raise ConfigError if the checkpoint's run differs from this one (unless
    --resume_allow_changes); returns the differences. Checkpoints older than the identity record
    are checked on their saved seed alone."""
    saved = saved_extra.get("run_identity")
    if not isinstance(saved, dict):
        saved = {"seed": saved_extra["seed"]} if "seed" in saved_extra else {}
    diffs = identity_differences(saved, run_identity(cfg, world_size))
    if diffs and not cfg.output.resume_allow_changes:
        lines = "\n  ".join(diffs)
        raise ConfigError(
            f"--resume_from_checkpoint {source}: this run is not the run that was saved:\n  {lines}\n"
            "Resume with the checkpoint's values to continue it exactly, or pass --resume_allow_changes to "
            "continue with the new ones (the result is then a different run)."
        )
    return diffs
