"""Write a complete diffusers-layout FLUX.1 Kontext [dev] folder with random weights, built offline.

    python -m fastvideo.tools.make_tiny_kontext OUT_DIR [--seed N]

A Kontext folder is a FLUX.1-dev folder (the same transformer class with its guidance embedding,
VAE, CLIP + T5 encoders and scheduler) whose model_index.json names FluxKontextPipeline: this is
make_tiny_flux's tiny folder with that index. diffusers' FluxKontextPipeline (the current library
line) loads it; the same seed gives the same weights, bit for bit.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from fastvideo.tools.make_tiny_flux import FLUX_MODEL_INDEX, folder_megabytes, make_tiny_flux
from fastvideo.utils import atomic_write_json

KONTEXT_MODEL_INDEX = {**FLUX_MODEL_INDEX, "_class_name": "FluxKontextPipeline", "_diffusers_version": "0.42.1",
                       "feature_extractor": [None, None], "image_encoder": [None, None]}


def make_tiny_kontext(out_dir: str | Path, seed: int = 0) -> Path:
    out = make_tiny_flux(out_dir, preset="tiny", seed=seed)
    atomic_write_json(out / "model_index.json", KONTEXT_MODEL_INDEX)
    return out


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(allow_abbrev=False, description=__doc__.splitlines()[0])
    ap.add_argument("out_dir", help="folder to write (created if missing)")
    ap.add_argument("--seed", type=int, default=0, help="the same seed writes the same weights (default: 0)")
    args = ap.parse_args(argv)
    out = make_tiny_kontext(args.out_dir, args.seed)
    print(f"wrote a tiny FLUX.1 Kontext folder to {out} ({folder_megabytes(out):.2f} MB, seed {args.seed})")


if __name__ == "__main__":
    main()
