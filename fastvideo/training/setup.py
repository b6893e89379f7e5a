"""A training run's set-up, in the order the loop relies on: checks that cost nothing first
(batch layout, resume identity), then data, models, rewards, optimiser and randomness.

Also the small pieces of the loop that are configuration rather than phases: the rollout
settings, the logged resolved configuration, and the reward metrics of an iteration.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch

from fastvideo import devices
from fastvideo.errors import ConfigError
from fastvideo.grpo.advantages import zero_std_ratio
from fastvideo.sampling.rollout import RolloutConfig
from fastvideo.utils import main_print


def rollout_config(cfg) -> RolloutConfig:
    r = cfg.rollout
    return RolloutConfig(
        height=r.height, width=r.width, sampling_steps=r.sampling_steps, eta=r.eta, shift=r.shift,
        guidance_scale=r.guidance_scale, num_generations=r.num_generations, rollout_batch_size=r.rollout_batch_size,
        init_same_noise=r.init_same_noise, quantize_timestep=r.quantize_timestep, share_ode_prefix=r.share_ode_prefix,
        same_noise_scope=r.same_noise_scope,
    )


def check_batch_layout(cfg, dims) -> None:
    samples = dims.dp_size * cfg.prompts_per_rank
    if not cfg.grpo.use_group and samples < 2:
        raise ConfigError(
            f"without --use_group each prompt gets one sample and advantages are normalised over the "
            f"{samples} sample(s) of all ranks; that needs at least 2: raise --train_batch_size or add "
            "--use_group --num_generations G"
        )


def check_resume(cfg, world_size: int):
    """Resolve --resume_from_checkpoint and refuse a changed run (run_identity.check_resume)."""
    spec = cfg.output.resume_from_checkpoint
    if not spec:
        return None
    from fastvideo.training import checkpoint
    from fastvideo.training.run_identity import check_resume as check

    path, saved = checkpoint.read_resume_point(spec, cfg.output.output_dir)
    for diff in check(saved, cfg, world_size, str(spec)):
        main_print(f"[resume] --resume_allow_changes: continuing with a changed setting: {diff}")
    return path


def prepare_output_dir(cfg, info, device) -> None:
    """Rank 0 refuses, clears (--overwrite) and locks OUTPUT_DIR (training/run_dir.py); every rank
    learns whether it failed (one int32 MAX), so that all stop together before any model loads."""
    from fastvideo.training import run_dir

    failure, notes = None, []
    if info.is_main:
        try:
            notes = run_dir.prepare_output_dir(cfg.output.output_dir, bool(cfg.output.resume_from_checkpoint),
                                               cfg.output.overwrite)
        except ConfigError as exc:
            failure = exc
    if info.world_size > 1:
        flag = torch.tensor([1 if failure is not None else 0], dtype=torch.int32, device=device)
        devices.all_reduce_max(flag)
        if failure is None and flag.item():
            raise run_dir.PeerRefused("rank 0 refused the output folder")
    if failure is not None:
        raise failure
    for note in notes:
        main_print(f"[outputs] {note}")


def build_parts(trainer) -> None:
    """Everything the loop needs, set as attributes of ``trainer`` (see the order in the docstring)."""
    from fastvideo.training import builders

    cfg, info, device = trainer.cfg, trainer.info, trainer.device
    check_batch_layout(cfg, trainer.dims)
    prepare_output_dir(cfg, info, device)
    trainer.resume_path = check_resume(cfg, info.world_size)  # before any model loads: a refused resume costs nothing
    devices.set_fast_matmul(device, cfg.model.allow_tf32)
    devices.seed_everything(cfg.optim.seed)
    builders.check_reward_endpoints(cfg)  # remote:/vlm: URLs answer, before any model loads
    from fastvideo.models.file_check import check_model_files

    check_model_files(cfg.model, trainer.family)  # a damaged config.json or weights file: one line, not a traceback
    trainer.dataset = builders.build_dataset(cfg, trainer.family)
    _scan_data(trainer.dataset, info, device)  # every embedding file there and well-shaped, before any model loads
    if cfg.eval is not None:  # held-out prompts must not be training prompts: found before any model loads
        from fastvideo.data.prompts import check_no_overlap, eval_captions

        check_no_overlap(eval_captions(cfg.eval.prompts), trainer.dataset.captions)
    trainer.transformer_config, trainer.model, trainer.vae = builders.build_models(cfg, device, trainer.family)
    trainer.dataset.check_against_transformer(trainer.transformer_config)
    trainer.kl_reference = builders.build_kl_reference(cfg, trainer.model, device, trainer.family)
    if cfg.output.dump_randomness or cfg.output.load_randomness:
        trainer.data_randomness = builders.build_randomness(cfg, info, kind="data")
    trainer.sampler = builders.build_sampler(cfg, len(trainer.dataset), trainer.dims, trainer.data_randomness)
    trainer.reward = builders.build_rewards(cfg, device, trainer.dims.dp_rank)
    if builders.overlap_reward_scoring(cfg.reward.overlap, device, builders.reward_device_for(cfg, device)):
        from fastvideo.training.reward_pipeline import ChunkScorer

        trainer.scorer = ChunkScorer(trainer.reward, trainer.vae, trainer.rollout_cfg, device,
                                     trainer.autocast_dtype, trainer.timer, trainer.family)
    trainer.optimizer, trainer.lr_scheduler = builders.build_optimizer(cfg, trainer.model, trainer.dims)
    trainer.ema = builders.build_ema(cfg, trainer.model)
    trainer.randomness = builders.build_randomness(cfg, info)


def fail_together(failure: Exception | None, world_size: int, device, peer_reason: str) -> None:
    """Every rank calls this at the same point: the rank that met ``failure`` raises it, the others
    raise PeerRefused (silent, exit 2) when any did (one int32 MAX), so that all stop together
    instead of the others going on to a collective the failed rank never joins (a gloo traceback)."""
    from fastvideo.training import run_dir

    if world_size > 1:
        flag = torch.tensor([1 if failure is not None else 0], dtype=torch.int32, device=device)
        devices.all_reduce_max(flag)
        if failure is None and flag.item():
            raise run_dir.PeerRefused(peer_reason)
    if failure is not None:
        raise failure


def _scan_data(dataset, info, device) -> None:
    """Each rank scans its share of the embedding files; all learn whether one failed (one int32
    MAX), so that all stop together (the others as PeerRefused: silent, exit 2) instead of the
    others going on to a collective the failed rank never joins (a gloo traceback, exit 1)."""
    from fastvideo.data.scan import scan_embeddings
    from fastvideo.errors import UserError

    scan, failure = None, None
    try:
        scan = scan_embeddings(dataset, info.rank, info.world_size)  # each rank a share
    except UserError as exc:
        failure = exc
    fail_together(failure, info.world_size, device, "another rank found a bad embedding file")
    main_print(f"[data] {len(dataset)} prompts: rank 0 checked {scan.files} embedding files, present and shaped "
               f"{scan.dims} ({scan.seconds:.2f} s)")


def log_config(cfg, info, device) -> None:
    """Print the resolved config with its derived quantities and keep it as OUTPUT_DIR/config.json."""
    from fastvideo.utils import atomic_write_json

    derived = cfg.derived(info.world_size)
    resolved = {**cfg.to_json(), "derived": derived, "device": str(device)}  # a valid --config file
    atomic_write_json(Path(cfg.output.output_dir) / "config.json", resolved)
    for note in cfg.compat_notes:
        main_print(f"[config] {note}")
    # the notes were just printed, one line each: not again inside the configuration's line
    main_print("[config] " + json.dumps({k: v for k, v in resolved.items() if k not in ("derived", "compat_notes")},
                                        default=str))
    main_print("[config] derived: " + " ".join(f"{k}={v}" for k, v in derived.items()))


def reward_metrics(dims, device, rewards, advantages: torch.Tensor, cfg) -> dict:
    """Reward and advantage statistics over the data-parallel group's samples ("_samples": how many).

    Samples a reward scored non-finite (dropped, rewards/combine.py) are left out of the reward
    statistics and counted: ``rewards/nonfinite_dropped`` (every iteration) and, when some,
    ``rewards/nonfinite/<name>`` per reward."""
    G = cfg.rollout.num_generations
    all_rewards = dims.gather_dp(rewards.total.to(device)).cpu()
    kept = _finite(all_rewards)
    record = {
        "reward_mean": kept.mean().item(),
        "reward_std": kept.std(unbiased=False).item(),
        # Without --use_group the whole gathered batch is the one normalisation group.
        "zero_std_ratio": zero_std_ratio(all_rewards, G if cfg.grpo.use_group else all_rewards.numel()).item(),
        "rewards/nonfinite_dropped": all_rewards.numel() - kept.numel(),
    }
    for name, vals in rewards.per_reward.items():
        everything = dims.gather_dp(vals.to(device)).cpu()
        finite = _finite(everything)
        record[f"reward/{name}_mean"] = finite.mean().item()
        record[f"reward/{name}_std"] = finite.std(unbiased=False).item()
        if finite.numel() < everything.numel():
            record[f"rewards/nonfinite/{name}"] = everything.numel() - finite.numel()
    all_adv = dims.gather_dp(advantages.to(device)).cpu()
    record.update(adv_mean=all_adv.mean().item(), adv_std=all_adv.std(unbiased=False).item(),
                  adv_abs_max=all_adv.abs().max().item(), _samples=all_rewards.numel())
    return record


def _finite(values: torch.Tensor) -> torch.Tensor:
    """The finite entries of [N] (the tensor itself when all are: the default path's statistics
    stay bit-identical)."""
    ok = torch.isfinite(values)
    return values if bool(ok.all()) else values[ok]
