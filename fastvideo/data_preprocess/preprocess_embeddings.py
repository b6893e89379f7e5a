"""Encode a prompts file into RL embeddings with a model family's text encoders (DanceGRPO's
data/rl_embeddings layout).

    torchrun --standalone --nproc_per_node=N fastvideo/data_preprocess/preprocess_embeddings.py \\
        --model_path data/flux --prompt_dir assets/prompts.txt --output_dir data/rl_embeddings [--model_family sd3]
    python -m fastvideo.data_preprocess.preprocess_embeddings ...      (one process)

DanceGRPO's name for it, fastvideo/data_preprocess/preprocess_flux_embedding.py, still works.

Each rank encodes a disjoint share on its local device; the output does not depend on the number
of ranks, and a rerun resumes. The logic lives in fastvideo.data_preprocess.embeddings.
"""

from __future__ import annotations

import argparse
import sys

if not __package__:  # run as a script path (torchrun's usual form): make the repo importable
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from fastvideo.data_preprocess.embeddings import PreprocessConfig, run_preprocess  # noqa: E402
from fastvideo.data_preprocess.sources import source_size  # noqa: E402
from fastvideo.errors import one_line_errors  # noqa: E402


def parse_args(argv: list[str] | None = None) -> PreprocessConfig:
    ap = one_line_errors(argparse.ArgumentParser(allow_abbrev=False, description=__doc__.splitlines()[0]))
    ap.add_argument(
        "--model_path", default="data/flux", help="diffusers-layout model folder (its text encoders are used)"
    )
    ap.add_argument(
        "--prompt_dir", "--prompt_path", dest="prompt_dir", default="assets/prompts.txt",
        help="prompts file, one prompt per line (DanceGRPO calls this flag --prompt_dir)",
    )
    ap.add_argument("--output_dir", default="data/rl_embeddings")
    ap.add_argument("--max_sequence_length", type=int, default=512, help="T5 tokens per prompt (padded)")
    ap.add_argument("--max_prompts", type=int, default=50000, help="keep the first N prompts after cleaning")
    ap.add_argument(
        "--batch_size", "--train_batch_size", dest="batch_size", type=int, default=8,
        help="prompts per encoder call on each rank",
    )
    ap.add_argument(
        "--dataloader_num_workers", type=int, default=1,
        help="DataLoader worker processes feeding prompt batches (0: in the main process)",
    )
    ap.add_argument("--model_family", default=None,
                    help="model family whose text encoders encode the prompts (a registered name or "
                         "pkg.module:Name); default: the one --model_path's model_index.json names, else flux")
    ap.add_argument("--overwrite", action="store_true",
                    help="replace embeddings in --output_dir made from other settings or captions, or of unknown "
                         "origin (no preprocess_meta.json); without it such a folder is refused, never deleted")
    ap.add_argument("--source_vae_size", type=source_size, default=None, metavar="SIDE|H,W",
                    help="an editing family that resizes its sources (qwen_image_edit): the area H*W each source "
                         "image is resized to, aspect kept, before the VAE (sides multiples of 32; default the "
                         "stock pipeline's 1024; Flow-Factory's condition_image_size). Sets the source tokens, "
                         "recorded with the embeddings")
    ap.add_argument("--num_frames", type=int, default=None,
                    help="image-to-video (--model_family wan_i2v): the frames of the clips training makes (its "
                         "--num_frames, 4k+1), which each first frame's VAE condition is encoded for (default: "
                         "the family's, 81)")
    a = ap.parse_args(argv)
    if a.model_family is None:  # the folder says (an SD3 folder would die in FLUX's T5 tokenizer)
        from fastvideo.models.registry import DEFAULT_FAMILY, family_of_folder

        a.model_family = family_of_folder(a.model_path) or DEFAULT_FAMILY
    return PreprocessConfig(
        model_path=a.model_path, prompt_file=a.prompt_dir, output_dir=a.output_dir,
        max_sequence_length=a.max_sequence_length, max_prompts=a.max_prompts,
        batch_size=a.batch_size, dataloader_num_workers=a.dataloader_num_workers, model_family=a.model_family,
        overwrite=a.overwrite, source_vae_size=a.source_vae_size, num_frames=a.num_frames,
    )


def main(argv: list[str] | None = None):
    cfg = parse_args(argv)
    cfg.validate()  # bad flags fail before torch.distributed or the encoders start
    return run_preprocess(cfg)


def cli(argv: list[str] | None = None) -> int:
    """main() for the command line: a user error prints its message alone and exits 2."""
    import os

    from fastvideo.errors import report_failure

    try:
        main(argv)
    except Exception as exc:  # noqa: BLE001 - reported, then the process exits
        world = int(os.environ.get("WORLD_SIZE", "1"))
        code = report_failure(exc, "preprocess_embeddings", int(os.environ.get("RANK", "0")) if world > 1 else None)
        if world > 1:
            os._exit(code)  # the other ranks may be waiting in a collective: torchrun stops them
        return code
    return 0


if __name__ == "__main__":
    sys.exit(cli())
