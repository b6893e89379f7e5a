"""FLOPs of one GRPO iteration by phase, and the utilisation a measured iteration time implies.

    python -m fastvideo.tools.cost_model [--h 720 --w 720 --sampling_steps 16 --num_generations 12
        --prompts_per_rank 1 --timestep_fraction 0.6 --world_size 16
        --gradient_checkpointing --model reference|flux-dev|small|tiny|PATH --model_family NAME
        --seconds_per_iteration S --peak_tflops P --device_name NAME]
    python -m fastvideo.tools.cost_model --memory [the run's flags: --fsdp_sharding_strategy full|hybrid|none
        --rollout_batch_size --train_micro_batch_size --mixed_precision --master_weight_type --use_ema
        --selective_checkpointing --use_cpu_offload --rewards --use_lora --lora_rank --lora_target_modules
        --lora_base_precision --kl_coef --algorithm ...] [--device npu|cuda|cpu --ranks_per_node N
        --hccl_buffsize_mb MB --device_memory_gb G]

Defaults are the reference configuration (DanceGRPO's FLUX script, 16 ranks). The model family
(--model_family, default flux) counts the transformer's FLOPs and shapes its memory; "reference"
(alias "flux-dev") is the family's reference model, tiny and small the presets of
fastvideo.tools.make_tiny_flux. PATH is a transformer config.json, a transformer folder or a
diffusers model folder (its vae/config.json is then used for the decode). MFU counts the work the algorithm needs (rollout, update forward
and backward, VAE decode); HFU adds the blocks gradient checkpointing recomputes.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from fastvideo.errors import ConfigError, UserError, exit_on_user_error, one_line_errors
from fastvideo.grpo.loss import num_trained_steps
from fastvideo.models.base import require_cost_model
from fastvideo.data_preprocess.sources import source_size, source_vae_family
from fastvideo.models.registry import DEFAULT_FAMILY, get_model_family
from fastvideo.perf.flops import (
    IterationFlops,
    IterationShape,
    human,
    iteration_flops,
    peak_tflops_for,
    utilisation,
)

from fastvideo.tools.cost_model_memory import _memory_flags, memory_report, memory_shape  # noqa: F401 (API)

# --model names of the family's reference model ("flux-dev": the name upstream's docs use).
REFERENCE_SPECS = ("reference", "flux-dev")


def resolve_model(spec: str, family) -> tuple[dict, dict, str]:
    """(transformer config, VAE config, description) for the family's reference model, 'tiny',
    'small' or a path."""
    if spec in REFERENCE_SPECS:
        return dict(family.reference_config), dict(family.reference_vae_config), family.reference_name
    if spec in getattr(family, "reference_models", {}):  # a family's published sizes by name (Wan's)
        config, vae_config, name = family.reference_models[spec]
        return dict(config), dict(vae_config), name
    if spec in ("tiny", "small") and family.name == "sd3":
        if spec == "small":
            raise ConfigError("--model small is a FLUX preset; the SD3 family has one tiny shape: --model tiny")
        from fastvideo.tools import make_tiny_sd3

        return make_tiny_sd3.transformer_config(), make_tiny_sd3.vae_config(), "tiny SD3 (make_tiny_sd3)"
    if spec in ("tiny", "small"):
        if family.name != "flux":
            raise ConfigError(f"--model {spec} is a FLUX preset; for --model_family {family.name} give its model "
                              "folder or transformer config.json")
        from fastvideo.tools.make_tiny_flux import PRESETS, transformer_config, vae_config

        p = PRESETS[spec]
        return transformer_config(p), vae_config(p), f"preset {spec}"
    path = Path(spec)
    if path.is_dir():
        candidates = [path / "config.json", path / "transformer" / "config.json"]
        found = next((c for c in candidates if c.is_file()), None)
        if found is None:
            raise ConfigError(
                f"--model {spec}: no config.json or transformer/config.json there; give reference, tiny, small, a "
                "transformer config.json or a diffusers model folder"
            )
        path = found
    if not path.is_file():
        raise ConfigError(f"--model {spec}: not reference/tiny/small and no such file or folder")
    config = json.loads(path.read_text())
    if path.parent.name == "transformer" and (path.parent.parent / "model_index.json").is_file():
        config = family.folder_cost_config(path.parent.parent, config)  # e.g. Wan2.2-A14B's two experts
    vae_path = path.parent.parent / "vae" / "config.json"
    if vae_path.is_file():
        return config, json.loads(vae_path.read_text()), str(path)
    return (config, dict(family.reference_vae_config),
            f"{path} (VAE: {family.reference_name}'s, no vae/config.json beside it)")


def sp_sizes(text: str) -> tuple[int, ...]:
    """--sp_sizes: positive integers, comma-separated (argparse names a bad one in one line)."""
    try:
        sizes = tuple(int(part) for part in text.split(","))
    except ValueError:
        sizes = ()
    if not sizes or min(sizes) < 1:
        raise argparse.ArgumentTypeError(f"{text!r}: give positive integers separated by commas, e.g. 1,2,4")
    return sizes


def set_num_frames(family, frames: int | None) -> None:
    """--num_frames: a video family's clip length (4k + 1); ConfigError for an image family."""
    if frames is None:
        return
    if not hasattr(family, "set_num_frames"):
        raise ConfigError(f"--num_frames: model family {family.name!r} makes images; leave the flag out")
    family.set_num_frames(frames)


def set_train_experts(family, config: dict, experts: str | None) -> None:
    """--train_experts: which experts of a two-expert model train; ConfigError for a model of one."""
    if experts is None:
        return
    if config.get("two_experts") is None:
        raise ConfigError(f"--train_experts {experts}: this model has one transformer; the flag is a two-expert "
                          "model's (--model wan2.2-t2v-a14b): leave it out")
    family.train_experts = experts


def parse_args(argv=None) -> argparse.Namespace:
    # No abbreviations: a training command line's --t would be an ambiguous prefix of --text_tokens ...
    ap = one_line_errors(argparse.ArgumentParser(description=__doc__.splitlines()[0], allow_abbrev=False))
    ap.add_argument("--model", default="reference",
                    help="reference (alias flux-dev) | tiny | small | config.json | model folder")
    ap.add_argument("--model_family", default=DEFAULT_FAMILY,
                    help="model family: a registered name or a plugin pkg.module:Name")
    ap.add_argument("--num_frames", type=int, default=None,
                    help="a video family's frames per clip, 4k+1 (default: the family's: Wan's 81)")
    ap.add_argument("--train_experts", default=None, choices=("high,low", "high", "low"),
                    help="a two-expert model (--model wan2.2-t2v-a14b): the experts trained, the other frozen "
                         "(default: both)")
    ap.add_argument("--h", type=int, default=720)
    ap.add_argument("--w", type=int, default=720)
    ap.add_argument("--text_tokens", type=int, default=512, help="T5 sequence length (max_sequence_length)")
    ap.add_argument("--sampling_steps", type=int, default=16, help="transformer forwards per rollout sample")
    ap.add_argument("--num_generations", type=int, default=12)
    ap.add_argument("--bestofn", type=int, default=0,
                    help="the trainer's --bestofn K: all G rolled out, K a prompt trained (0: all)")
    ap.add_argument("--prompts_per_rank", "--train_batch_size", dest="prompts_per_rank", type=int, default=1)
    ap.add_argument("--world_size", type=int, default=16)
    ap.add_argument("--timestep_fraction", type=float, default=0.6)
    ap.add_argument("--train_last_step", action="store_true",
                    help="also train the last transition (the trainer's flag; upstream never trains it)")
    ap.add_argument("--trained_steps", type=int, default=None,
                    help="override T (default: int((sampling_steps - 1 + train_last_step) * timestep_fraction))")
    ap.add_argument("--gradient_checkpointing", action=argparse.BooleanOptionalAction, default=True)
    ap.add_argument("--algorithm", default="grpo", choices=["grpo", "nft", "awm", "dgpo", "flash_grpo"],
                    help="the objective's trained steps and no-grad forwards, as it declares them: nft, awm, dgpo "
                         "train int(N x fraction) of all N timesteps (no stored transition), nft and dgpo one more "
                         "no-grad forward (the old policy) per trained step, dgpo one more (its reference, always), awm one "
                         "more with --awm_ema_kl_beta > 0 (its EMA, a float32 copy of the trainable weights); "
                         "flash_grpo trains its one SDE step; nft, awm, dgpo keep no log-prob")
    ap.add_argument("--kl_coef", type=float, default=0.0, help="> 0: one more no-grad forward (the reference) per "
                                                                "trained step")
    ap.add_argument("--seconds_per_iteration", type=float, default=None, help="measured wall time of one iteration")
    ap.add_argument("--peak_tflops", type=float, default=None, help="dense bf16 peak per device, TFLOPS")
    ap.add_argument("--device_name", default=None, help="look the peak up by name (H800, H200, A100, 910C, ...)")
    ap.add_argument("--source_vae_size", type=source_size, default=None, metavar="SIDE|H,W",
                    help="an editing family's source area before the VAE (preprocessing's flag; its source tokens)")
    ap.add_argument("--json", action="store_true", help="print one JSON object instead of the table")
    ap.add_argument("--sp_table", action="store_true", help="activation memory and all-to-all bytes per forward, "
                    "per rank, at each of --sp_sizes (Ulysses sequence parallelism; perf/sequence_parallel.py)")
    ap.add_argument("--sp_sizes", type=sp_sizes, default=(1, 2, 4), metavar="N,N,...",
                    help="--sp_table's sequence-parallel sizes (default 1,2,4; each must divide --h / 16)")
    _memory_flags(ap.add_argument_group("memory model (--memory)"))
    add_mix_arguments(ap)
    args, extra = ap.parse_known_args(argv)
    args.trained_steps_given = args.trained_steps is not None
    ignored = training_flags_without_cost(extra, ap, args.algorithm)
    if ignored:
        sys.stderr.write(f"cost_model: no effect on the cost, ignored: {', '.join(ignored)}\n")
    if args.trained_steps is None:
        if not 0.0 < args.timestep_fraction <= 1.0:
            ap.error(f"--timestep_fraction {args.timestep_fraction} must be in (0, 1]")
        args.trained_steps = num_trained_steps(args.sampling_steps, args.timestep_fraction, args.train_last_step)
    objective_counts(args, extra)
    for flag in ("seconds_per_iteration", "peak_tflops"):
        value = getattr(args, flag)
        if value is not None and not (0 < value < float("inf")):
            ap.error(f"--{flag} {value} must be a positive number")
    for flag in ("h", "w", "sampling_steps", "num_generations", "world_size", "prompts_per_rank"):
        if getattr(args, flag) < 1:
            ap.error(f"--{flag} {getattr(args, flag)} must be at least 1")
    if args.bestofn and (args.bestofn % 2 or not 2 <= args.bestofn <= args.num_generations):
        ap.error(f"--bestofn {args.bestofn}: give an even K from 2 to --num_generations {args.num_generations}, or 0")
    if args.rewards:
        from fastvideo.rewards.combine import parse_reward_spec

        try:
            parse_reward_spec(args.rewards)
        except UserError as exc:
            ap.error(str(exc))
    if args.use_lora and not args.memory:
        ap.error("--use_lora: the FLOPs of LoRA training are not modelled (a frozen base's backward computes no "
                 "weight gradients; the adapters add their own matmuls); --memory models its memory")
    resolve_mix(args, ap)
    return args


def objective_counts(args, training_flags: list[str]) -> None:
    """args.trained_steps (the objective's own count, unless --trained_steps), objective_reference and
    nograd_update_forwards per trained step (NFT's / DGPO's old policy, AWM's EMA with --awm_ema_kl_beta,
    the reference) as --algorithm's settings say, its own flags read from ``training_flags``."""
    from fastvideo.tools.cost_model_memory import objective_update

    args.training_flags = training_flags  # read again by cost_model_memory.memory_shape
    trained, needs = objective_update(args)
    args.objective_reference = needs.reference
    if trained is not None and not args.trained_steps_given:  # the objective's own count (not GRPO's)
        args.trained_steps = trained
    args.nograd_update_forwards = int(needs.old_policy) + int(needs.update_copy) + int(needs.reference)


# Training flags that change the cost but are not modelled here: refused rather than ignored.
# (--kl_coef: a flag above; MixGRPO's --kl_coeff reuses the rollout's stored log-probabilities: no cost.)
UNMODELLED = ("--sp_size",)  # --sp_table models it on its own


def training_flags_without_cost(extra: list[str], ap: argparse.ArgumentParser, algorithm: str = "grpo") -> list[str]:
    """The training flags (fastvideo.config's, with --algorithm's own: AWM's, DGPO's, Flash-GRPO's)
    among the words the cost model does not take: they are ignored and named. An unknown flag, or
    one that changes the cost but is not modelled, stops with ap.error."""
    from fastvideo.config import build_parser

    training = {s for a in build_parser(["--algorithm", algorithm])._actions for s in a.option_strings}
    ignored, i = [], 0
    while i < len(extra):
        word = extra[i]
        name = word.split("=", 1)[0]
        if not name.startswith("--") or name not in training:
            ap.error(f"unrecognized argument {word!r} (neither a cost-model nor a training flag)")
        value = word.split("=", 1)[1] if "=" in word else (extra[i + 1] if i + 1 < len(extra) else "")
        if name in UNMODELLED and value.strip() != "1":  # --sp_size 1 (a launcher's default) is no SP
            ap.error(f"{name} changes the cost but is not modelled here: estimate without it")
        ignored.append(name)
        i += 1
        while "=" not in word and i < len(extra) and not extra[i].startswith("--"):
            i += 1  # the flag's value(s)
    return list(dict.fromkeys(ignored))


# ----------------------------------------------------------------------------- mixed sampling (MixGRPO)
REFERENCE_STEPS, REFERENCE_FRACTION = 16, 0.6  # DanceGRPO's FLUX script


def add_mix_arguments(ap: argparse.ArgumentParser) -> None:
    g = ap.add_argument_group("mixed sampling (the trainer's flags; see fastvideo.sampling.mix)")
    g.add_argument("--training_strategy", default="all", choices=["all", "part"],
                   help="part: MixGRPO's SDE window of --group_size steps, ODE elsewhere, every window step trained")
    g.add_argument("--group_size", type=int, default=4, help="MixGRPO's window size")
    g.add_argument("--sde_steps", type=int, default=0, help="Flow-GRPO-Fast: k SDE (trained) steps")
    g.add_argument("--window_start", type=int, default=0, help="where the window is (the Flash tail depends on it)")
    g.add_argument("--dpm_algorithm_type", default="null", choices=["null", "dpmsolver", "dpmsolver++"])
    g.add_argument("--dpm_apply_strategy", default="post", choices=["post", "all"],
                   help="post: compressed DPM tail after the window; all: full schedule (no fewer passes)")
    g.add_argument("--dpm_post_compress_ratio", type=float, default=0.4)


def resolve_mix(args, ap) -> None:
    """Sets args.rollout_steps (forwards per rollout sample) and, for a window, args.trained_steps."""
    from fastvideo.grpo.loss import candidate_steps
    from fastvideo.perf.flops import plan_steps

    window = args.sde_steps or (args.group_size if args.training_strategy == "part" else 0)
    post = args.dpm_algorithm_type != "null" and args.dpm_apply_strategy == "post"
    if post and not window:
        ap.error(f"--dpm_algorithm_type {args.dpm_algorithm_type} --dpm_apply_strategy post needs a window "
                 "(--training_strategy part or --sde_steps)")
    cands = candidate_steps(args.sampling_steps, args.train_last_step)
    if window and not 0 <= args.window_start < cands:
        ap.error(f"--window_start {args.window_start} must be in [0, {cands})")
    ratio = args.dpm_post_compress_ratio if post else None  # all: the full schedule, N passes
    args.rollout_steps, trained = plan_steps(args.sampling_steps, cands, args.trained_steps, window=window,
                                             window_start=args.window_start, dpm_post_ratio=ratio)
    if window:
        args.trained_steps = trained
    args.mix_window = window


def mix_comparison(args, config: dict, vae_cfg: dict, flops: dict, family) -> dict:
    """This configuration's FLOPs against DanceGRPO's reference (16 steps, fraction 0.6) and against
    the all-SDE run with the same number of sampling steps and --timestep_fraction."""
    out = {}
    for name, steps in (("dancegrpo_reference", REFERENCE_STEPS), ("full_sde_same_steps", args.sampling_steps)):
        shape = IterationShape(
            height=args.h, width=args.w, text_tokens=args.text_tokens, sampling_steps=steps,
            num_generations=args.num_generations, prompts_per_rank=args.prompts_per_rank,
            world_size=args.world_size, bestofn=args.bestofn,
            trained_steps=num_trained_steps(steps, REFERENCE_FRACTION if name == "dancegrpo_reference"
                                            else args.timestep_fraction, args.train_last_step),
            gradient_checkpointing=args.gradient_checkpointing,
        )
        ref = iteration_flops(shape, config, vae_cfg, family).as_dict()
        out[name] = {"sampling_steps": steps, "trained_steps": shape.trained_steps,
                     "model_flops_ratio": flops["model_total"] / ref["model_total"],
                     "hardware_flops_ratio": flops["hardware_total"] / ref["hardware_total"]}
    return out


def format_mix(cmp: dict) -> str:
    lines = [""]
    for name, c in cmp.items():
        lines.append(f"vs {name.replace('_', ' ')} ({c['sampling_steps']} steps, {c['trained_steps']} trained): "
                     f"model FLOPs x{c['model_flops_ratio']:.3f}, hardware FLOPs x{c['hardware_flops_ratio']:.3f}")
    return "\n".join(lines)


def _peak(args) -> float | None:
    if args.peak_tflops is not None:
        return args.peak_tflops
    if args.device_name:
        peak = peak_tflops_for(args.device_name)
        if peak is None:
            raise ConfigError(f"no peak known for device {args.device_name!r}: pass --peak_tflops")
        return peak
    return None


SUMMARY_KEYS = ("forward", "backward", "blocks")


def summarise(args, config: dict, vae_cfg: dict, family=None) -> dict:
    """Everything the table shows, as plain numbers. family: default --model_family's."""
    family = family if family is not None else get_model_family(args.model_family)
    shape = IterationShape(
        height=args.h, width=args.w, text_tokens=args.text_tokens,
        sampling_steps=getattr(args, "rollout_steps", args.sampling_steps),
        num_generations=args.num_generations, prompts_per_rank=args.prompts_per_rank,
        world_size=args.world_size, trained_steps=args.trained_steps,
        gradient_checkpointing=args.gradient_checkpointing,
        nograd_update_forwards=getattr(args, "nograd_update_forwards", 0), bestofn=getattr(args, "bestofn", 0),
    )
    it: IterationFlops = iteration_flops(shape, config, vae_cfg, family)
    per = family.transformer_flops(config, shape.image_tokens, shape.text_tokens)
    out = {
        "image_tokens": shape.image_tokens, "text_tokens": shape.text_tokens, "samples": shape.samples,
        **({"trained_samples": shape.trained_samples} if shape.bestofn else {}),
        "sampling_steps": shape.sampling_steps, "trained_steps": shape.trained_steps,
        "gradient_checkpointing": shape.gradient_checkpointing, "world_size": shape.world_size,
        "nograd_update_forwards": shape.nograd_update_forwards,
        # The family's parts of one forward (its "forward", "backward", "blocks" totals apart).
        "forward_breakdown": {k: v for k, v in per.items() if k not in SUMMARY_KEYS},
        "_forward": (per["forward"], per["blocks"]),  # for the table; not in --json's output
        "flops": it.as_dict(),
    }
    out["vs"] = mix_comparison(args, config, vae_cfg, out["flops"], family)
    peak = _peak(args)
    if args.seconds_per_iteration is not None:
        per_dev = it.hardware_flops / args.seconds_per_iteration / args.world_size / 1e12
        out["seconds_per_iteration"] = args.seconds_per_iteration
        out["achieved_hardware_tflops_per_device"] = per_dev
        if peak is not None:
            out["peak_tflops_per_device"] = peak
            out["mfu"] = utilisation(it.model_flops, args.seconds_per_iteration, args.world_size, peak)
            out["hfu"] = utilisation(it.hardware_flops, args.seconds_per_iteration, args.world_size, peak)
    return out


def format_table(s: dict, model_desc: str) -> str:
    f = s["flops"]
    n, t = s["samples"], s["trained_steps"]
    nt = s.get("trained_samples", n)  # --bestofn: the update trains fewer than the rollout draws
    total = f["hardware_total"]
    forward, blocks = s["_forward"]
    lines = [
        f"model {model_desc}: {s['image_tokens']} image + {s['text_tokens']} text tokens",
        f"one transformer forward (1 sample): {human(forward)} FLOPs "
        f"(blocks {100 * blocks / forward:.2f} %)",
        f"iteration: {n} samples ({s['world_size']} ranks), {s['sampling_steps']} sampling steps, "
        f"{t} trained steps{f' of {nt} samples (--bestofn)' if nt != n else ''}, gradient checkpointing "
        f"{'on' if s['gradient_checkpointing'] else 'off'}",
        "",
        f"{'phase':<24}{'work':>26}{'FLOPs':>14}{'share':>9}",
    ]
    rows = [
        ("rollout (no grad)", f"{s['sampling_steps'] * n} forwards", f["rollout"]),
        ("update forward", f"{t * nt} forwards", f["update_forward"]),
        ("update backward", f"{t * nt} backwards", f["update_backward"]),
        *([("update no-grad", f"{s['nograd_update_forwards'] * t * nt} forwards", f["update_nograd"])]
          if s["nograd_update_forwards"] else []),
        ("recompute (checkpoint)", f"{t * nt if f['recompute'] else 0} block forwards", f["recompute"]),
        ("VAE decode", f"{n} decodes", f["vae_decode"]),
    ]
    for name, work, flops in rows:
        lines.append(f"{name:<24}{work:>26}{human(flops):>14}{100 * flops / total:>8.1f}%")
    lines.append(f"{'total (hardware, HFU)':<24}{'':>26}{human(total):>14}{100.0:>8.1f}%")
    lines.append(f"{'total (model, MFU)':<24}{'no recompute':>26}{human(f['model_total']):>14}"
                 f"{100 * f['model_total'] / total:>8.1f}%")
    lines.append("not counted: text encoders (prompts are pre-embedded), reward model, element-wise ops")
    if "seconds_per_iteration" in s:
        lines.append("")
        lines.append(f"{s['seconds_per_iteration']:g} s per iteration on {s['world_size']} devices: "
                     f"{s['achieved_hardware_tflops_per_device']:.1f} TFLOPS per device executed")
        if "mfu" in s:
            lines.append(f"peak {s['peak_tflops_per_device']:g} TFLOPS per device: MFU {100 * s['mfu']:.1f} %, "
                         f"HFU {100 * s['hfu']:.1f} %")
        else:
            lines.append("pass --peak_tflops or --device_name for MFU")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    try:
        family = require_cost_model(source_vae_family(args.model_family, args.source_vae_size))
        set_num_frames(family, args.num_frames)
        config, vae_cfg, desc = resolve_model(args.model, family)
        set_train_experts(family, config, args.train_experts)
        if args.memory:
            print(memory_report(args, config, vae_cfg, desc, family))
            return
        if args.sp_table:
            from fastvideo.perf.sequence_parallel import format_rows, sp_rows

            print(format_rows(sp_rows(config, family, args.h, args.w, args.text_tokens, sizes=args.sp_sizes), desc,
                              args.h, args.w, args.text_tokens))
            return
        s = summarise(args, config, vae_cfg, family)
    except (UserError, ValueError) as err:  # bad flags or a bad config file: one line, exit 2
        exit_on_user_error("cost_model", err)
    if args.json:
        json.dump({"model": desc, **{k: v for k, v in s.items() if not k.startswith("_")}}, sys.stdout, indent=2)
        print()
    else:
        print(format_table(s, desc) + format_mix(s["vs"]))


if __name__ == "__main__":
    main()
