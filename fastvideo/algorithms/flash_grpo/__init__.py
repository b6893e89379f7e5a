"""Flash-GRPO (arXiv 2605.15980): single-step training, ``--algorithm flash_grpo`` (docs/objectives.md)."""
