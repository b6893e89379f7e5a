"""The prompt data's settings: which embeddings file, how many prompts each rank takes per
iteration, how many threads load them and how many MiB of loaded embeddings each process keeps
(fastvideo.data.cache). config.json keeps these four at its top level (cfg.data_json_path reads
cfg.data.data_json_path)."""

from __future__ import annotations

import argparse
from dataclasses import dataclass

from fastvideo.errors import ConfigError
from fastvideo.settings import Settings, at_least_one, flag_group

# --embedding_cache_mb's default; also the value of a resolved config written before the flag existed.
EMBEDDING_CACHE_MB = 1024


@dataclass
class DataSettings(Settings):
    data_json_path: str
    dataloader_num_workers: int
    prompts_per_rank: int
    embedding_cache_mb: int = EMBEDDING_CACHE_MB

    section = "data"
    top_level = True  # config.json keeps these at its top level; cfg.<field> reads them

    @classmethod
    def add_flags(cls, parser: argparse.ArgumentParser) -> None:
        g = flag_group(parser, "data")
        g.add_argument("--data_json_path", type=str, required=True,
                       help="videos2caption.json written by preprocess_embeddings (scripts/preprocess/)")
        g.add_argument("--dataloader_num_workers", type=int, default=4,
                       help="threads that load prompt embeddings in parallel (0: in the main thread)")
        g.add_argument("--train_batch_size", type=int, default=1, help="prompts per rank per iteration")
        g.add_argument("--embedding_cache_mb", type=int, default=EMBEDDING_CACHE_MB,
                       help="MiB of loaded prompt embeddings each training process keeps in host memory, "
                            "admitted while they fit and then kept, so their files are read once, not every "
                            "iteration (FLUX: ~4.2 MB a prompt at 512 tokens); 0: read them every time")

    @classmethod
    def from_args(cls, args: argparse.Namespace) -> "DataSettings":
        at_least_one(args, "train_batch_size")
        return cls(args.data_json_path, args.dataloader_num_workers, args.train_batch_size,
                   args.embedding_cache_mb).checked()

    @classmethod
    def flags_from_resolved(cls, section: dict) -> dict:
        """section: its part of the resolved config (config.json keeps its keys at the top level)."""
        return {"data_json_path": section["data_json_path"],
                "dataloader_num_workers": section["dataloader_num_workers"],
                "train_batch_size": section["prompts_per_rank"],
                "embedding_cache_mb": section.get("embedding_cache_mb", EMBEDDING_CACHE_MB)}

    def check(self) -> None:
        if self.dataloader_num_workers < 0:
            raise ConfigError("--dataloader_num_workers must be >= 0")
        if self.embedding_cache_mb < 0:
            raise ConfigError(f"--embedding_cache_mb must be >= 0 (0 turns the cache off), "
                              f"got {self.embedding_cache_mb}")
