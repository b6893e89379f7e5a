"""Export a training checkpoint's transformer as a diffusers folder.

    python -m fastvideo.tools.export CKPT OUT [--ema] [--base MODEL_DIR] [--dtype fp32|bf16]
    python -m fastvideo.tools.export LORA_CKPT OUT --lora  [--ema]    # OUT/pytorch_lora_weights.safetensors
    python -m fastvideo.tools.export LORA_CKPT OUT --merge [--ema] [--base MODEL_DIR] [--dtype ...]

Without --base, OUT is a transformer folder (config.json + diffusion_pytorch_model.safetensors):

    transformer = FluxTransformer2DModel.from_pretrained(OUT)
    pipe = FluxPipeline.from_pretrained(BASE_FLUX_DIR, transformer=transformer)

With --base, OUT is a complete FLUX pipeline folder: every component of MODEL_DIR (hard-linked
when the file system allows, else copied) with its transformer/ replaced by the checkpoint's, so
``FluxPipeline.from_pretrained(OUT)`` works directly and the trainer accepts it as
--pretrained_model_name_or_path. The transformer config comes from the checkpoint itself; the
base folder is needed only for the other components. --ema exports the EMA weights; a run trained
with --export_ema exports them by default (--policy then exports the policy).

A LoRA checkpoint (--use_lora; it holds pytorch_lora_weights.safetensors, the adapters only) exports with --lora as
a diffusers LoRA file, ``pipe.load_lora_weights(OUT)`` on the stock FluxPipeline of the base model
(the scale alpha / rank is folded into lora_B: diffusers 0.32 loads a file at scale 1), or with
--merge as a full transformer folder (base + scale * B @ A) like a full fine-tuning export. The
base transformer for --merge is the one the run trained on (recorded in the checkpoint) unless
--base names a FLUX folder.
"""

from __future__ import annotations

import argparse

from fastvideo.errors import one_line_errors

# The library (fastvideo/training/export.py); export_checkpoint stays importable from here too.
from fastvideo.training.export import DTYPES, export_checkpoint, export_lora, export_merged, lora_load_lines


def main(argv: list[str] | None = None) -> None:
    ap = one_line_errors(argparse.ArgumentParser(allow_abbrev=False, description=__doc__.splitlines()[0]))
    ap.add_argument("checkpoint", help="a checkpoint-N folder written by the trainer")
    ap.add_argument("out", help="folder to write")
    ap.add_argument("--ema", action="store_true", help="export the EMA weights instead of the policy")
    ap.add_argument("--policy", action="store_true",
                    help="export the policy weights of a run trained with --export_ema (its default is the EMA)")
    ap.add_argument("--base", default=None,
                    help="model folder (the checkpoint's family) whose other components complete a pipeline folder")
    ap.add_argument("--dtype", default=None, choices=sorted(DTYPES), help="cast the weights (default: as saved)")
    ap.add_argument("--overwrite", action="store_true", help="replace OUT if it exists")
    ap.add_argument("--lora", action="store_true",
                    help="LoRA checkpoint -> OUT/pytorch_lora_weights.safetensors for FluxPipeline.load_lora_weights")
    ap.add_argument("--merge", action="store_true",
                    help="LoRA checkpoint -> a full transformer folder with the adapters merged into the base")
    args = ap.parse_args(argv)
    if args.ema and args.policy:
        ap.error("--ema and --policy name two different weight sets; give one")
    if not args.policy and not args.ema:  # the run's own choice (--export_ema, DiffusionNFT's checkpoint)
        from fastvideo.training.checkpoint.files import recorded_export_ema

        args.ema = recorded_export_ema(args.checkpoint)
    if args.lora and args.merge:
        ap.error("--lora and --merge are two different exports; give one")
    if args.lora and (args.base or args.dtype):
        ap.error("--lora writes the adapters only (float32); --base and --dtype apply to full and --merge exports")
    try:
        if args.lora:
            out = export_lora(args.checkpoint, args.out, args.ema, args.overwrite)
            print(f"exported the {'EMA ' if args.ema else ''}LoRA adapters of {args.checkpoint} to {out}; load with "
                  + "; ".join(lora_load_lines(out)))
            return
        if args.merge:
            out = export_merged(args.checkpoint, args.out, args.ema, args.base, args.dtype, args.overwrite)
            print(f"exported {args.checkpoint} with its LoRA merged as a diffusers transformer folder: {out}")
            return
        out = export_checkpoint(args.checkpoint, args.out, args.ema, args.base, args.dtype, args.overwrite)
    except Exception as exc:  # noqa: BLE001 - a user error prints alone, anything else with its traceback
        from fastvideo.errors import report_failure

        raise SystemExit(report_failure(exc, "export")) from exc
    kind = "pipeline folder" if args.base else "transformer folder"
    print(f"exported {'EMA' if args.ema else 'policy'} weights of {args.checkpoint} as a diffusers {kind}: {out}")


if __name__ == "__main__":
    main()
