"""Which test files one library line's suite leaves to the other's.

CI runs the suite on both library lines (.ci/run). A file listed here tests the trainer's own
mechanics on the tiny FLUX.1 (checkpoints, resume, signals, run folders, bad input, the pre-flight,
rewards' plumbing, evaluation, the lean iteration's bookkeeping, GRPO's maths): what it asserts does
not change with diffusers / transformers / peft, so running it a second time on the current line
costs minutes and checks nothing new. The recipe line's suite (README's default test command) runs
every file; on the current line these are skipped with the reason below. What the lines differ in
stays on both: model families and their parity with the stock pipelines, loading, the patches,
samplers against diffusers' schedulers, reward models against their packages, LoRA (peft),
compile, sequence parallelism's attention, FSDP wrapping of each line's blocks, preprocessing (the
text encoders), the launchers' line choice, and every current-line family's training.

The other way round, CURRENT_HOME lists the launcher wrappers' dry runs and smoke runs (the shell
around torchrun: flags, overrides, lean choices on the tiny FLUX.1), which the current line's suite
runs and the recipe line's skips: the current-line families' launchers are at home there.

FLUX_GRPO_ALL_TESTS=1 runs every file on either line.
"""

from __future__ import annotations

from pathlib import Path

TESTS = Path(__file__).resolve().parent
REASON = ("line-independent (tests/line_split.py): the trainer's own mechanics, run by the recipe line's suite; "
          "FLUX_GRPO_ALL_TESTS=1 runs it here too")
REASON_RECIPE = ("line-independent (tests/line_split.py): the launchers' shell, run by the current line's suite; "
                 "FLUX_GRPO_ALL_TESTS=1 runs it here too")

LINE_INDEPENDENT = (
    "test_device_names.py", "test_devices.py", "test_hccl_rules.py", "test_npu_stub.py", "test_preflight.py",
    "test_progress.py", "test_user_errors.py",
    "algorithms/test_drop_zero_advantage.py", "algorithms/test_mixgrpo_objective.py",
    "algorithms/test_objective_protocol.py",
    "alignment/test_alignment_compare.py", "alignment/test_alignment_probes.py",
    "alignment/test_alignment_replay.py", "alignment/test_alignment_trainer_e2e.py",
    "alignment/test_probes_distributed.py",
    "distributed/test_comm_count.py", "distributed/test_fsdp_throughput.py",
    "eval/test_eval_core.py", "eval/test_eval_grid.py", "eval/test_eval_prompts.py", "eval/test_eval_settings.py",
    "eval/test_eval_stats.py", "eval/test_torn_logs.py",
    "grpo/test_boundaries.py", "grpo/test_global_std.py", "grpo/test_grpo_math.py", "grpo/test_kl.py",
    "perf/test_bench_scripts.py", "perf/test_comms.py", "perf/test_iteration.py", "perf/test_mix_accounting.py",
    "perf/test_nft_race.py", "perf/test_syncs.py",
    "tools/test_compare_metrics.py", "tools/test_omp_threads.py", "tools/test_reward_server.py",
    "tools/test_reward_server_guard.py",
    "training/test_awm_training.py", "training/test_batched_replay.py", "training/test_checkpoint_shards_modes.py",
    "training/test_checkpoint_shards_training.py", "training/test_comm_lean.py", "training/test_config_file.py",
    "training/test_dgpo_training.py", "training/test_ema.py", "training/test_embedding_cache_reads.py",
    "training/test_fsdp2_training.py", "training/test_grad_sync.py", "training/test_group_sampling.py",
    "training/test_grpo_guard_training.py", "training/test_guard.py", "training/test_hooks.py",
    "training/test_lean.py", "training/test_metrics.py", "training/test_mixgrpo.py", "training/test_no_float64.py",
    "training/test_nonfinite_rewards.py", "training/test_optimizer_kernels.py", "training/test_protocol_plugins.py",
    "training/test_remote_reward_training.py", "training/test_resume_changes.py",
    "training/test_reward_curve_title.py", "training/test_reward_mix_training.py",
    "training/test_reward_pipeline.py", "training/test_reward_plugin_training.py",
    "training/test_reward_server_faults.py", "training/test_run_dir.py", "training/test_run_identity.py",
    "training/test_sequence_parallel_rewards.py", "training/test_signals.py", "training/test_sync_budget.py",
    "training/test_trainer.py", "training/test_upstream_launch_lines.py",
)

CURRENT_HOME = ("scripts/test_launcher_smoke.py", "scripts/test_launcher_lean.py")


def skip_reason(relpath: str, line: str, environ: dict) -> str | None:
    """Why the test file ``relpath`` (relative to tests/) is left to the other line's suite; None: it runs here."""
    if environ.get("FLUX_GRPO_ALL_TESTS", "0") == "1":
        return None
    if line == "current" and relpath in LINE_INDEPENDENT:
        return REASON
    if line != "current" and relpath in CURRENT_HOME:
        return REASON_RECIPE
    return None


def skipped_here(relpath: str, line: str, environ: dict) -> bool:
    """Whether the test file ``relpath`` (relative to tests/) is left to the other line's suite."""
    return skip_reason(relpath, line, environ) is not None


def missing() -> list[str]:
    """Listed files that do not exist (a rename would silently run them on one line... or none)."""
    return [p for p in LINE_INDEPENDENT + CURRENT_HOME if not (TESTS / p).is_file()]
