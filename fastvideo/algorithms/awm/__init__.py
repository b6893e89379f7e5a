"""Advantage Weighted Matching (arXiv 2509.25050), ``--algorithm awm`` (docs/objectives.md)."""
