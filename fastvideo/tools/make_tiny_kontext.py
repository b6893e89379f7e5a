"""Write a complete diffusers-layout FLUX.1 Kontext [dev] folder with random weights, built offline.

    python -m fastvideo.tools.make_tiny_kontext OUT_DIR [--seed N]

A Kontext folder is a FLUX.1-dev folder (the same transformer class with its guidance embedding,
VAE, CLIP + T5 encoders and scheduler) whose model_index.json names FluxKontextPipeline: this is
make_tiny_flux's tiny folder with that index. diffusers' FluxKontextPipeline (the current library
line) loads it; the same seed gives the same weights, bit for bit.
"""

from __future__ import annotations

import json
from pathlib import Path

from fastvideo.tools.make_tiny_flux import make_tiny_flux
from fastvideo.tools.tiny_builder import run_builder_cli
from fastvideo.utils import atomic_write_json

# FluxKontextPipeline's entries over the FLUX.1 index (updated in place: the two new keys go last).
KONTEXT_INDEX_UPDATE = {"_class_name": "FluxKontextPipeline", "_diffusers_version": "0.42.1",
                        "feature_extractor": [None, None], "image_encoder": [None, None]}


def make_tiny_kontext(out_dir: str | Path, seed: int = 0) -> Path:
    out = make_tiny_flux(out_dir, preset="tiny", seed=seed)
    index = json.loads((out / "model_index.json").read_text(encoding="utf-8"))
    atomic_write_json(out / "model_index.json", {**index, **KONTEXT_INDEX_UPDATE})
    return out


def main(argv: list[str] | None = None) -> None:
    run_builder_cli("make_tiny_kontext", __doc__, lambda a: make_tiny_kontext(a.out_dir, a.seed),
                    lambda a: "a tiny FLUX.1 Kontext", argv)


if __name__ == "__main__":
    main()
