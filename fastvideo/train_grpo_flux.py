"""GRPO fine-tuning of FLUX: thin entry point (parse -> build -> train -> clean up).

    torchrun --nproc_per_node=N fastvideo/train_grpo_flux.py --data_json_path ... [flags]

Accepts upstream DanceGRPO's and the Ascend recipe's flags (see fastvideo/config.py).
"""

from __future__ import annotations

import gc
import os
import sys
import warnings

# torch's FSDP1 optimizer-state gather warns about gloo/CPU process groups at every checkpoint;
# the warnings are about a deprecated internal helper and say nothing the user can act on.
warnings.filterwarnings("ignore", message=".*_get_pg_default_device.*")
warnings.filterwarnings("ignore", message="Multiple backends are registered with this ProcessGroup.*")


def build_hooks(trainer) -> list:
    """The hooks a training run gets from its flags, in the order they run at each point: wandb,
    image saving, the run recorder, the reward curve, evaluation with its guard. Alignment probes
    run once here (they need the built model and write under --record_dir)."""
    from fastvideo.training.hooks import ImageSaverHook, LogLineHook, RewardCurveHook, WandbHook

    cfg, info = trainer.cfg, trainer.info
    hooks = []
    if cfg.output.report_to == "wandb" and info.is_main:
        hooks.append(WandbHook(cfg))
    hooks.append(LogLineHook(cfg.output.log_every, cfg.optim.max_train_steps))
    hooks.append(ImageSaverHook(cfg.output.save_images_every, cfg.output.image_dir, cfg.rollout.num_generations))
    if cfg.output.record_dir:
        from fastvideo.alignment.recorder import RunRecorder

        hooks.append(RunRecorder(cfg, info))
    hooks.append(RewardCurveHook())
    if cfg.eval is not None:
        from fastvideo.eval.loop import TrainingEvaluation

        hooks.append(TrainingEvaluation(cfg.eval, trainer))
    if cfg.output.probe_layers:
        from fastvideo.alignment.probes import run_probes_for_config

        run_probes_for_config(cfg, trainer.model, trainer.vae, trainer.device)
    return hooks


def build_trainer(cfg, info):
    """A set-up trainer with the run's hooks registered (what main trains)."""
    from fastvideo.training.trainer import Trainer

    trainer = Trainer(cfg, info)
    trainer.setup()
    for hook in build_hooks(trainer):
        trainer.add_hook(hook)
    return trainer


def main(argv: list[str] | None = None) -> int:
    # Parse before importing torch (devices): --help, --print_config and flag errors come back fast.
    from fastvideo.config import parse_config

    cfg = parse_config(argv)
    from fastvideo import devices
    from fastvideo.errors import report_failure

    info = devices.init_distributed()
    try:
        build_trainer(cfg, info).train()
    except BaseException as exc:
        if isinstance(exc, SystemExit) and not exc.code:
            raise
        # Say which rank failed and why (a user error as its message alone, exit 2; anything else
        # with its traceback, exit 1), then exit without waiting on collectives: torchrun sees the
        # failure and stops the other ranks instead of letting them hang.
        code = report_failure(exc, "train_grpo_flux", info.rank if info.world_size > 1 else None)
        if info.world_size > 1:
            os._exit(code)
        return code
    # Free the wrapped models (DDP/FSDP hold the process group and C++ state) while the group still
    # exists: left to interpreter teardown, after the group is destroyed, a rank could abort at exit
    # ("terminate called without an active exception") after its work was done and saved.
    gc.collect()
    devices.barrier()
    devices.destroy_distributed()
    return 0


if __name__ == "__main__":
    if __package__ in (None, ""):
        # Run as a script path (torchrun fastvideo/train_grpo_flux.py, as upstream's launchers do):
        # Python put fastvideo/ first on sys.path. Put this tree's root there instead, so that
        # `fastvideo` is this tree's package (not another checkout's editable install) and its
        # modules (config, settings, utils ...) are not importable as top-level names.
        here = os.path.dirname(os.path.abspath(__file__))
        sys.path[:] = [p for p in sys.path if os.path.abspath(p or ".") != here]
        sys.path.insert(0, os.path.dirname(here))
    sys.exit(main())
