"""A training run's parts, built in the order the loop relies on: the start-up checks that cost
nothing first (the objective's world rules, the output folder, the resume identity), then data,
models, rewards, optimiser and randomness. ``build_parts`` returns them as one typed RunParts."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from fastvideo import devices
from fastvideo.distributed.fsdp import describe as fsdp_describe
from fastvideo.sampling.rollout import RolloutConfig
from fastvideo.training import builders
from fastvideo.training.run import start
from fastvideo.utils import main_print


@dataclass
class RunParts:
    """Everything the loop needs besides its own state. kl_reference, data_randomness, scorer and
    ema are None when the run has none."""

    resume_path: Path | None  # the checkpoint to resume from (None: a fresh run)
    dataset: Any  # data.dataset.PromptEmbeddingDataset
    transformer_config: dict  # the transformer's diffusers config (JSON-safe, with _class_name)
    model: torch.nn.Module  # the trainable transformer, wrapped (FSDP / DDP) and maybe compiled
    vae: torch.nn.Module  # frozen, in the decode dtype
    kl_reference: Any  # training.kl_reference's frozen reference policy
    data_randomness: Any  # the prompt order's sampling.randomness.RandomSource under --dump/--load_randomness
    sampler: Any  # data.sampler.GroupDistributedSampler
    reward: Any  # rewards.combine.MultiReward
    scorer: Any  # training.reward_pipeline.ChunkScorer when decode + reward overlap the rollout
    optimizer: torch.optim.Optimizer
    lr_scheduler: Any
    ema: Any  # training.ema.EMA
    randomness: Any  # sampling.randomness.RandomSource of the rollout and the update


def rollout_config(cfg) -> RolloutConfig:
    """The sampler's settings: the run's rollout section itself (one type, sampling.settings)."""
    return cfg.rollout


def _check_data(cfg, info, family):
    """The dataset, every embedding file present and well-shaped and no held-out prompt among its
    prompts, before any model loads."""
    from fastvideo.models.file_check import check_model_files

    check_model_files(cfg.model, family)  # a damaged config.json or weights file: one line, not a traceback
    dataset = builders.build_dataset(cfg, family)
    _scan_data(dataset, info)
    family.check_run_size(dataset.dims(), cfg.rollout.height, cfg.rollout.width)  # before any model loads
    if cfg.eval is not None:
        from fastvideo.data.prompts import check_no_overlap, eval_captions

        check_no_overlap(eval_captions(cfg.eval.prompts), dataset.captions)
    return dataset


def build_parts(cfg, info: devices.DistInfo, dims, family, timer, autocast_dtype) -> RunParts:
    """The run's parts for this rank. ``family``: its models.base.ModelFamily; ``timer``: the loop's
    metrics.PhaseTimer (the overlapped scorer times its chunks on it)."""
    device = info.device
    start.check_world(cfg, dims)
    start.prepare_output_dir(cfg, info, device)
    resume_path = start.check_resume(cfg, info.world_size)  # before any model loads: a refused resume costs nothing
    devices.set_fast_matmul(device, cfg.model.allow_tf32)
    devices.seed_everything(cfg.optim.seed)
    builders.check_reward_endpoints(cfg)  # remote:/vlm: URLs answer, before any model loads
    dataset = _check_data(cfg, info, family)
    transformer_config, model, vae = builders.build_models(cfg, device, family)
    main_print(f"[parallel] {fsdp_describe(model, cfg.fsdp_strategy)}")
    dataset.check_against_transformer(transformer_config)
    kl_reference = builders.build_kl_reference(cfg, model, device, family)
    reference = getattr(kl_reference, "model", None)  # its own copy (full fine-tuning) or the model (LoRA)
    builders.install_sequence_parallel([model, reference if reference is not model else None], family, dims)
    data_randomness = None
    if cfg.output.dump_randomness or cfg.output.load_randomness:
        data_randomness = builders.build_randomness(cfg, info, kind="data")
    sampler = builders.build_sampler(cfg, len(dataset), dims, data_randomness)
    reward = builders.build_rewards(cfg, device, dims.dp_rank, family)
    scorer = None
    if builders.overlap_reward_scoring(cfg.reward.overlap, device, builders.reward_device_for(cfg, device)):
        from fastvideo.training.reward_pipeline import ChunkScorer

        scorer = ChunkScorer(reward, vae, rollout_config(cfg), device, autocast_dtype, timer, family)
    optimizer, lr_scheduler = builders.build_optimizer(cfg, model, dims)
    return RunParts(resume_path=resume_path, dataset=dataset, transformer_config=transformer_config, model=model,
                    vae=vae, kl_reference=kl_reference, data_randomness=data_randomness, sampler=sampler,
                    reward=reward, scorer=scorer, optimizer=optimizer, lr_scheduler=lr_scheduler,
                    ema=builders.build_ema(cfg, model), randomness=builders.build_randomness(cfg, info))


def _scan_data(dataset, info) -> None:
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
    start.fail_together(failure, info.world_size, info.device, "another rank found a bad embedding file")
    main_print(f"[data] {len(dataset)} prompts: rank 0 checked {scan.files} embedding files, present and shaped "
               f"{scan.dims} ({scan.seconds:.2f} s)")
