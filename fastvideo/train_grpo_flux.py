"""GRPO fine-tuning of FLUX: thin entry point (parse -> build -> train -> clean up).

    torchrun --nproc_per_node=N fastvideo/train_grpo_flux.py --data_json_path ... [flags]

Accepts upstream DanceGRPO's and the Ascend recipe's flags (see fastvideo/config.py).
"""

from __future__ import annotations

import gc
import os
import sys
import warnings

# The parent pid as this process started, before any import that takes time: a torchrun worker
# checks its parent-death guard against it (run_control.die_with_parent), so that a launcher
# killed while the worker was still starting leaves no orphan.
_PARENT_AT_START = os.getppid()

# torch's FSDP1 optimizer-state gather warns about gloo/CPU process groups at every checkpoint;
# the warnings are about a deprecated internal helper and say nothing the user can act on.
warnings.filterwarnings("ignore", message=".*_get_pg_default_device.*")
warnings.filterwarnings("ignore", message="Multiple backends are registered with this ProcessGroup.*")


def build_hooks(trainer) -> list:
    """The hooks a training run gets from its flags, in the order they run at each point: wandb,
    image saving, the run recorder, the reward curve, evaluation with its guard. Alignment probes
    run once here (they need the built model and write under --record_dir)."""
    from fastvideo.training.hooks import ImageSaverHook, LogLineHook, RewardCurveHook, TensorBoardHook, WandbHook

    cfg, info = trainer.cfg, trainer.info
    hooks = []
    if cfg.output.report_to in ("wandb", "tensorboard") and info.is_main:
        hooks.append((WandbHook if cfg.output.report_to == "wandb" else TensorBoardHook)(cfg))
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


def _rank_from_env() -> int:
    return int(os.environ.get("RANK", "0") or 0)


def report_user_error(exc: BaseException, rank: int) -> int:
    """A user error that every rank meets alike (a flag, a missing input): one line, from rank 0
    only (under fastvideo.launch: written for the launcher, which prints each distinct line once).
    Returns the exit status (2)."""
    from fastvideo.errors import USER_ERROR_EXIT, ServiceError, one_line, report_failure
    from fastvideo.training.run import control as run_control
    from fastvideo.training.run import output_dir as run_dir

    if isinstance(exc, run_dir.PeerRefused):
        return USER_ERROR_EXIT
    if run_control.control_dir() is not None:  # one line: the launcher reads each rank's first
        run_control.write_rank_error(rank, f"train_grpo_flux: error: {one_line(exc)}")
        return USER_ERROR_EXIT
    if rank == 0:
        return report_failure(exc, "train_grpo_flux")
    if isinstance(exc, ServiceError):  # one rank's request may fail alone: never no line at all
        return report_failure(exc, "train_grpo_flux", rank)
    return USER_ERROR_EXIT


def _with_resume_point(exc: BaseException, output_dir: str) -> BaseException:
    """A full disk (a checkpoint, a log, an image) or a reward server failing mid-run: one line
    naming what failed and the last complete checkpoint to resume from (nothing half-written was
    published); other errors unchanged."""
    from fastvideo.errors import DiskFullError, ServiceError, UserError, is_disk_full, one_line
    from fastvideo.rewards.http import RemoteRewardError

    if is_disk_full(exc):
        name = f" ({exc.filename})" if isinstance(exc, OSError) and exc.filename and \
            str(exc.filename) not in str(exc) else ""
        kind, what, fix = DiskFullError, f"{one_line(exc)}{name}", "free space"
    elif isinstance(exc, RemoteRewardError) and not isinstance(exc, UserError):  # start-up's are UserErrors
        kind, what, fix = ServiceError, one_line(exc), "fix or restart the reward server"
    else:
        return exc
    from fastvideo.training.checkpoint import find_latest

    latest = find_latest(output_dir)
    where = f"the last complete checkpoint is {latest}" if latest else "no checkpoint is complete yet"
    return kind(f"{what}; {where}: {fix}, then run the same command with --resume_from_checkpoint latest")


def _report(exc: BaseException, info) -> int:
    from fastvideo.errors import UserError, report_failure
    from fastvideo.training.run import control as run_control

    if isinstance(exc, UserError):
        return report_user_error(exc, info.rank)
    code = report_failure(exc, "train_grpo_flux", info.rank if info.world_size > 1 else None)
    run_control.write_rank_error(info.rank, f"train_grpo_flux failed on rank {info.rank}: {type(exc).__name__}: {exc}")
    return code


def _stopped(trainer, info, argv: list[str]) -> int:
    """After SIGTERM / SIGINT: say where the run stopped and how to resume it; the exit status."""
    from fastvideo.training.run.control import StopRequest, plain_torchrun_note, resume_command

    signum, path = trainer.stopped_by
    if info.is_main:
        import signal

        name = signal.Signals(signum).name
        if path is None:
            print(f"[stop] {name}: stopped after iteration {trainer.iteration} without a checkpoint "
                  "(--no_checkpoint_on_signal, or no iteration done)", flush=True)
        else:
            print(f"[stop] {name}: checkpoint {path} written after iteration {trainer.iteration}; resume with:\n"
                  f"  {resume_command([sys.argv[0], *argv], path)}", flush=True)
            note = plain_torchrun_note(signum)
            if note:
                print(note, file=sys.stderr, flush=True)
    return StopRequest.exit_code(signum)


def _input_problems(args, cfg) -> list[str]:
    """The launcher's checks of the inputs the flags name and of the memory (what --print_config
    warns about)."""
    from fastvideo.preflight import file_problems

    return file_problems(args, cfg) + (_memory_problems(cfg) if cfg is not None else [])


def _memory_problems(cfg) -> list[str]:
    """The launchers' pre-spawn memory check, on every start (a plain `python -m` or `torchrun`
    too): --h/--w too large for this device are refused before anything is allocated, where the
    run would otherwise grow until the kernel kills it."""
    from fastvideo import devices
    from fastvideo.preflight import memory_problems

    return memory_problems(cfg, int(os.environ.get("LOCAL_WORLD_SIZE", "1")), devices.device_type())


def main(argv: list[str] | None = None) -> int:
    # Parse before importing torch (devices): --help, --print_config and flag errors come back fast.
    argv = list(sys.argv[1:] if argv is None else argv)
    if os.environ.get("TORCHELASTIC_RUN_ID"):  # a torchrun worker: die with the launcher, armed first
        from fastvideo.training.run import control as run_control

        run_control.die_with_parent(parent=run_control.launcher_pid(_PARENT_AT_START))
    from fastvideo.config import parse_config
    from fastvideo.errors import ConfigError, UserError
    from fastvideo.import_name import problem

    foreign = problem(check_origin=True)  # hao-ai-lab's FastVideo installed here too: one line, exit 2
    if foreign is not None:
        return report_user_error(UserError(foreign), _rank_from_env())
    try:
        cfg = parse_config(argv, usage=False, input_check=_input_problems)
        too_large = _memory_problems(cfg)
        if too_large:
            raise ConfigError(too_large[0])
    except UserError as exc:  # every rank parses the same flags: one line, from rank 0
        return report_user_error(exc, _rank_from_env())
    from fastvideo import devices
    from fastvideo.training.run import control as run_control
    from fastvideo.training.run import output_dir as run_dir

    try:
        with run_control.rendezvous_watchdog("train_grpo_flux", _rank_from_env(), devices.dist_env()[2]):
            info = devices.init_distributed()
    except UserError as exc:  # FASTVIDEO_DEVICE names no usable device: one line, exit 2
        return report_user_error(exc, _rank_from_env())
    stop = run_control.StopRequest().install()
    code = 0
    try:
        trainer = build_trainer(cfg, info)
        trainer.stop_request = stop
        trainer.train()
        if trainer.stopped_by is not None:
            code = _stopped(trainer, info, argv)
    except BaseException as exc:
        if isinstance(exc, SystemExit) and not exc.code:
            raise
        # Say why (a user error as one line, exit 2; anything else with its traceback, exit 1), then
        # exit without waiting on collectives: torchrun sees the failure and stops the other ranks
        # instead of letting them hang.
        code = _report(_with_resume_point(exc, cfg.output.output_dir), info)
        if info.is_main:
            run_dir.release_lock(cfg.output.output_dir)
        if info.world_size > 1:
            os._exit(code)
        return code
    finally:
        stop.uninstall()
    if info.is_main:
        run_dir.release_lock(cfg.output.output_dir)
        if trainer.stopped_by is None:
            from fastvideo.training.run.start import closing_line

            print(closing_line(cfg.output.output_dir, trainer.saved, trainer.iteration), flush=True)
    # Free the wrapped models (DDP/FSDP hold the process group and C++ state) while the group still
    # exists: left to interpreter teardown, after the group is destroyed, a rank could abort at exit
    # ("terminate called without an active exception") after its work was done and saved.
    del trainer
    gc.collect()
    devices.barrier()
    devices.destroy_distributed()
    return code


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
