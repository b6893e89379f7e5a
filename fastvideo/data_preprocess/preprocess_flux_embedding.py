"""DanceGRPO's name for the preprocessing entry point: fastvideo/data_preprocess/preprocess_embeddings.py
(every model family; this name is kept so upstream's launch lines run unchanged)."""

from __future__ import annotations

import sys

if not __package__:  # run as a script path (torchrun's usual form): make the repo importable
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from fastvideo.data_preprocess.preprocess_embeddings import cli, main, parse_args  # noqa: E402,F401

if __name__ == "__main__":
    sys.exit(cli())
