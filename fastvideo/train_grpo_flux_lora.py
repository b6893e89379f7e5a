"""LoRA GRPO fine-tuning of FLUX: upstream DanceGRPO's entry point, a thin alias.

    torchrun --nproc_per_node=N fastvideo/train_grpo_flux_lora.py --data_json_path ... \\
        --lora_rank 128 --lora_alpha 256 [--resume_from_lora_checkpoint DIR] [flags]

The same trainer as fastvideo/train_grpo_flux.py with --use_lora implied (training/lora.py);
upstream's launch lines (scripts/finetune/finetune_flux_grpo_8gpus_lora.sh) run unchanged.
"""

from __future__ import annotations

import os
import sys

if __package__ in (None, ""):
    # Run as a script path (torchrun fastvideo/train_grpo_flux_lora.py): this tree's root, not
    # fastvideo/, on sys.path (see train_grpo_flux.py).
    _here = os.path.dirname(os.path.abspath(__file__))
    sys.path[:] = [p for p in sys.path if os.path.abspath(p or ".") != _here]
    sys.path.insert(0, os.path.dirname(_here))

from fastvideo.train_grpo_flux import main as _train_main  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if "--use_lora" not in argv:
        argv.insert(0, "--use_lora")
    return _train_main(argv)


if __name__ == "__main__":
    sys.exit(main())
