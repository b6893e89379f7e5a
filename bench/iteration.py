"""Where an iteration's time goes, and proof that no transformer pass is hidden.

    python bench/iteration.py [--preset small] [--size 128] [--iterations 3] [--micro 1 2 4 8]
    python bench/iteration.py --overlap_ab [--reward hps_base]   # overlapped reward scoring, off vs on

Runs the real trainer in this process (CPU, fp32, one rank) on a tiny/small random FLUX and
prints, per iteration configuration:
  * transformer forward passes counted by hooks against the analytic count
    (rollout: steps x samples; update: trained steps x samples; recompute with gradient
    checkpointing: the same again, counted on the blocks);
  * seconds per phase (rollout, decode, reward, update) and their shares;
  * the share of wall time spent outside model compute (transformer forward + backward + VAE decode);
  * update samples/s against train_micro_batch_size.
With --overlap_ab it instead runs one configuration (the first --micro) twice, with decode +
reward scoring after the rollout (--reward_overlap off) and overlapped with it (on), and
prints both rows with the iteration speed-up. --reward hps_base scores with a ViT-B/16-sized
random HPS model, so that the reward costs something on CPU (compressibility costs ~1 ms).
A benchmark, not a test: it prints figures, it asserts only the forward-pass count.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
os.environ.setdefault("FASTVIDEO_DEVICE", "cpu")
os.environ.setdefault("HF_HUB_OFFLINE", "1")

import torch  # noqa: E402


class ComputeMeter:
    """Counts and times transformer forwards (top level and per block) and backward calls."""

    def __init__(self, model):
        from diffusers.models.transformers.transformer_flux import FluxSingleTransformerBlock, FluxTransformerBlock

        self.forward_calls = 0
        self.backward_calls = 0
        self.forward_samples = 0
        self.block_calls = 0
        self.seconds = 0.0
        self._t0 = None
        model.register_forward_pre_hook(self._pre, with_kwargs=True)
        model.register_forward_hook(self._post)
        self.num_blocks = sum(isinstance(m, (FluxTransformerBlock, FluxSingleTransformerBlock)) for m in model.modules())
        real_backward = torch.Tensor.backward
        meter = self

        def timed_backward(tensor, *args, **kwargs):
            t = time.perf_counter()
            meter.backward_calls += 1
            real_backward(tensor, *args, **kwargs)
            meter.seconds += time.perf_counter() - t

        torch.Tensor.backward = timed_backward

    def _pre(self, module, args, kwargs):
        self._t0 = time.perf_counter()
        hs = kwargs.get("hidden_states", args[0] if args else None)
        self.forward_calls += 1
        self.forward_samples += int(hs.shape[0])

    def _post(self, module, args, output):
        self.seconds += time.perf_counter() - self._t0

    def reset(self):
        self.forward_calls = self.forward_samples = self.block_calls = self.backward_calls = 0
        self.seconds = 0.0


BLOCK_CALLS = [0]


@contextlib.contextmanager
def count_block_executions():
    """Count every execution of a FLUX block's forward, including activation-checkpointing
    recomputation (which calls forward directly and so bypasses module hooks), while inside; the
    classes get their own forward back on exit (tests run this bench in-process: a counter left on
    the classes would be traced by a later --compile)."""
    from diffusers.models.transformers.transformer_flux import FluxSingleTransformerBlock, FluxTransformerBlock

    originals = {cls: cls.forward for cls in (FluxTransformerBlock, FluxSingleTransformerBlock)}
    for cls, original in originals.items():
        def counted(self, *args, _original=original, **kwargs):
            BLOCK_CALLS[0] += 1
            return _original(self, *args, **kwargs)

        cls.forward = counted
    try:
        yield
    finally:
        for cls, original in originals.items():
            cls.forward = original


def build_inputs(preset: str, work: Path) -> tuple[Path, Path]:
    from fastvideo.data_preprocess.embeddings import PreprocessConfig, run_preprocess
    from fastvideo.tools.make_tiny_flux import make_tiny_flux

    model = make_tiny_flux(work / preset, preset=preset, seed=0)
    res = run_preprocess(PreprocessConfig(model_path=str(model), prompt_file=str(ROOT / "assets" / "prompts_tiny.txt"),
                                          output_dir=str(work / "emb"), max_sequence_length=64, batch_size=8,
                                          dataloader_num_workers=0))
    return model, Path(res.json_path)


def reward_flags(reward: str, work: Path) -> list[str]:
    if reward == "compressibility":
        return ["--rewards", "compressibility:1.0"]
    from fastvideo.tools.make_tiny_reward import HPS_PRESETS, write_hps

    preset = reward.split("_", 1)[1]
    folder = write_hps(work / f"hps_{preset}", seed=0, preset=preset)[0]
    return ["--rewards", "hpsv2:1.0", "--hps_ckpt_dir", str(folder), "--hps_model_name", HPS_PRESETS[preset][0]]


def run(model: Path, data: Path, out: Path, args, micro: int, checkpointing: bool, extra=()) -> dict:
    from fastvideo import devices
    from fastvideo.config import parse_config
    from fastvideo.training.trainer import Trainer

    argv = [
        "--data_json_path", str(data), "--pretrained_model_name_or_path", str(model), "--output_dir", str(out),
        "--h", str(args.size), "--w", str(args.size),
        "--sampling_steps", str(args.steps), "--eta", "0.3", "--num_generations", str(args.generations),
        "--train_batch_size", "1", "--rollout_batch_size", str(args.rollout_batch_size),
        "--train_micro_batch_size", str(micro), "--gradient_accumulation_steps", "1",
        "--timestep_fraction", "0.6", "--ignore_last", "--use_group", "--mixed_precision", "no",
        "--max_train_steps", str(args.iterations), "--checkpointing_steps", "1000", "--save_images_every", "0",
        "--dataloader_num_workers", "0", "--fsdp_sharding_strategy", "none",
    ] + (["--gradient_checkpointing"] if checkpointing else []) + list(extra)
    cfg = parse_config(argv)
    trainer = Trainer(cfg, devices.init_distributed())
    trainer.setup()
    trainer.save_checkpoint = lambda: None  # benchmark only: no checkpoint I/O in the timings
    meter = ComputeMeter(trainer.model)
    rows = []
    from fastvideo.perf.flops import pass_counts

    for _ in range(args.iterations):
        meter.reset()
        BLOCK_CALLS[0] = 0
        plan = trainer.sampling_plan(trainer.iteration + 1)  # the plan run_iteration will use
        cpu0 = time.process_time()
        rec = trainer.run_iteration()
        rec = dict(rec, cpu_iteration=time.process_time() - cpu0)
        meter.block_calls = BLOCK_CALLS[0]
        B = cfg.rollout.num_generations * cfg.prompts_per_rank
        prefix = rec.get("shared_ode_prefix", 0)
        counts = pass_counts(plan.num_steps, plan.num_trained, B, cfg.rollout.rollout_batch_size, micro,
                             shared_prefix=prefix, prompts=cfg.prompts_per_rank)
        rows.append(dict(
            rec=rec, calls=meter.forward_calls, samples=meter.forward_samples,
            expected_samples=counts.rollout_forward_samples + counts.update_forward_samples,
            backward_calls=meter.backward_calls, expected_backward_calls=counts.update_calls,
            block_calls=meter.block_calls,
            expected_block_calls=counts.block_calls(meter.num_blocks, checkpointing),
            compute_s=meter.seconds + rec.get("time_decode", 0.0), B=B, T=plan.num_trained, plan=plan,
        ))
    last = dict(rows[-1])  # the last iteration (warm)
    last["all"] = rows
    return last


def main() -> None:
    ap = argparse.ArgumentParser(allow_abbrev=False, description=__doc__.splitlines()[0])
    ap.add_argument("--preset", default="small", choices=["tiny", "small"])
    ap.add_argument("--size", type=int, default=128)
    ap.add_argument("--steps", type=int, default=8)
    ap.add_argument("--generations", type=int, default=8)
    ap.add_argument("--rollout_batch_size", type=int, default=4)
    ap.add_argument("--iterations", type=int, default=2)
    ap.add_argument("--micro", type=int, nargs="+", default=[1, 2, 4, 8])
    ap.add_argument("--reward", default="compressibility", choices=["compressibility", "hps_tiny", "hps_base"])
    ap.add_argument("--vae_precision", default="auto", choices=["auto", "fp32", "bf16"])
    ap.add_argument("--threads", type=int, default=None,
                    help="torch intra-op threads of the main thread (--threads 1 with --overlap_ab: sampling "
                         "on one core and scoring on the other, as when a GPU samples and the CPU scores)")
    ap.add_argument("--modes", nargs="+", default=None, choices=list(MODES),
                    help="compare sampling plans instead of the micro-batch table: full (DanceGRPO, --steps, "
                         "fraction 0.6), mixgrpo (25 steps, window 4), flash (+ DPM-Solver++ tail, ratio 0.4), "
                         "fast (--steps, 2 SDE steps at a random start), mixgrpo_mid (the window at start 11, "
                         "the ODE prefix once per group) and mixgrpo_mid_unshared (--no_share_ode_prefix)")
    ap.add_argument("--overlap_ab", action="store_true",
                    help="compare --reward_overlap off and on instead of the micro-batch table")
    ap.add_argument("--flush_denormal", action="store_true",
                    help="CPU: flush denormal floats to zero. Deterministic (ODE) sampling drifts into denormals "
                         "that x86 computes slowly, which charges plans with ODE steps ~5%% more rollout time "
                         "on CPU than on an accelerator")
    args = ap.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    if args.flush_denormal and not torch.set_flush_denormal(True):
        raise SystemExit("--flush_denormal: this CPU cannot flush denormals (no SSE3)")
    torch.manual_seed(0)
    with count_block_executions(), tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        model, data = build_inputs(args.preset, work)
        common = reward_flags(args.reward, work) + ["--vae_precision", args.vae_precision]
        if args.overlap_ab:
            return overlap_ab(model, data, work, args, common)
        if args.modes:
            return compare_modes(model, data, work, args, common)
        print(f"# {args.preset} preset, {args.size}x{args.size}, {args.steps} steps, G={args.generations}, "
              f"rollout_batch_size {args.rollout_batch_size}, torch threads {torch.get_num_threads()}\n")
        print("| micro | ckpt | fwd samples (counted/analytic) | block calls (counted/analytic) | rollout s | decode s | "
              "reward s | update s | iteration s | outside model compute | update samples/s |")
        print("|---|---|---|---|---|---|---|---|---|---|---|")
        for checkpointing in (False, True):
            for micro in args.micro if not checkpointing else args.micro[:1]:
                r = run(model, data, work / f"out_{micro}_{checkpointing}", args, micro, checkpointing,
                        common)
                rec = r["rec"]
                it = rec["time_iteration"]
                outside = max(0.0, it - r["compute_s"]) / it
                ok = "ok" if (r["samples"], r["block_calls"]) == (r["expected_samples"], r["expected_block_calls"]) else "MISMATCH"
                print(f"| {micro} | {checkpointing} | {r['samples']}/{r['expected_samples']} | "
                      f"{r['block_calls']}/{r['expected_block_calls']} {ok} | {rec['time_rollout']:.2f} | "
                      f"{rec['time_decode']:.2f} | {rec['time_reward']:.3f} | {rec['time_update']:.2f} | {it:.2f} | "
                      f"{100 * outside:.1f}% | {r['B'] * r['T'] / rec['time_update']:.1f} |", flush=True)
                if ok != "ok":
                    raise SystemExit("hidden or missing transformer passes: see the row above")


MIXGRPO = ["--training_strategy", "part", "--group_size", "4", "--iters_per_group", "25", "--sample_strategy",
           "progressive", "--prog_overlap", "--prog_overlap_step", "1", "--roll_back", "--init_same_noise"]
MODES = {  # name -> (sampling steps or None for --steps, extra flags)
    "full": (None, []),
    "full25": (25, []),
    "mixgrpo": (25, MIXGRPO),
    "flash": (25, MIXGRPO + ["--dpm_algorithm_type", "dpmsolver++", "--dpm_post_compress_ratio", "0.4",
                             "--dpm_solver_order", "2", "--dpm_solver_type", "midpoint"]),
    "fast": (None, ["--sde_steps", "2", "--sde_start", "random"]),
    # MixGRPO's 4-step window where the progressive schedule spends the average iteration (start 11
    # of 0..23): the 11 ODE steps before it are computed once per group (--init_same_noise)
    "mixgrpo_mid": (25, ["--sde_steps", "4", "--sde_start", "11", "--init_same_noise"]),
    "mixgrpo_mid_unshared": (25, ["--sde_steps", "4", "--sde_start", "11", "--init_same_noise",
                                  "--no_share_ode_prefix"]),
}


def _median_times(rows: list[dict]) -> dict:
    """Per-phase medians over the warm iterations (a shared CPU's load comes and goes)."""
    import statistics

    keys = ("time_rollout", "time_update", "time_iteration", "cpu_iteration")
    return {k: statistics.median(r["rec"][k] for r in rows) for k in keys}


def compare_modes(model: Path, data: Path, work: Path, args, common: list[str]) -> None:
    """Seconds per iteration of each sampling plan (medians over the iterations after the first),
    with the counted transformer passes checked on every iteration. The CPU-time column is the
    process's CPU seconds: with one thread it does not grow when other jobs share the cores."""
    micro = args.micro[0]
    print(f"# {args.preset} preset, {args.size}x{args.size}, G={args.generations}, rollout_batch_size "
          f"{args.rollout_batch_size}, micro {micro}, torch threads {torch.get_num_threads()}, medians of "
          f"iterations 2..{args.iterations}\n")
    print("| mode | steps | plan | fwd samples (counted/analytic) | backward calls | rollout s | update s | "
          "iteration s | vs first | CPU s / iteration | vs first (CPU) |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    base = base_cpu = None
    steps0 = args.steps
    for name in args.modes:
        steps, extra = MODES[name]
        args.steps = steps or steps0
        r = run(model, data, work / f"out_{name}", args, micro, False, common + extra)
        args.steps = steps0
        rec = _median_times(r["all"][1:] or r["all"])
        it, cpu = rec["time_iteration"], rec["cpu_iteration"]
        base, base_cpu = base or it, base_cpu or cpu
        ok = all((x["samples"], x["backward_calls"]) == (x["expected_samples"], x["expected_backward_calls"])
                 for x in r["all"])
        print(f"| {name} | {steps or steps0} | {r['plan'].describe()} | {r['samples']}/{r['expected_samples']} | "
              f"{r['backward_calls']}/{r['expected_backward_calls']} {'ok' if ok else 'MISMATCH'} | "
              f"{rec['time_rollout']:.2f} | {rec['time_update']:.2f} | {it:.2f} | {base / it:.2f}x | {cpu:.2f} | "
              f"{base_cpu / cpu:.2f}x |", flush=True)
        if not ok:
            raise SystemExit("hidden or missing transformer passes: see the row above")


def overlap_ab(model: Path, data: Path, work: Path, args, common: list[str]) -> None:
    micro = args.micro[0]
    print(f"# {args.preset} preset, {args.size}x{args.size}, {args.steps} steps, G={args.generations}, rollout_batch_size "
          f"{args.rollout_batch_size}, micro {micro}, reward {args.reward}, vae {args.vae_precision}, "
          f"torch threads {torch.get_num_threads()}\n")
    print("| reward scoring | rollout s | decode s | reward s (exposed) | reward s (busy) | update s | iteration s | "
          "vs serial |")
    print("|---|---|---|---|---|---|---|---|")
    serial = None
    for name, extra in (("serial", ["--reward_overlap", "off"]), ("overlapped", ["--reward_overlap", "on"])):
        rec = run(model, data, work / f"out_{name}", args, micro, False, common + extra)["rec"]
        it = rec["time_iteration"]
        serial = serial or it
        busy = rec.get("time_reward_busy", rec["time_reward"])
        print(f"| {name} | {rec['time_rollout']:.2f} | {rec['time_decode']:.2f} | {rec['time_reward']:.3f} | "
              f"{busy:.3f} | {rec['time_update']:.2f} | {it:.2f} | {serial / it:.2f}x |", flush=True)


if __name__ == "__main__":
    main()
