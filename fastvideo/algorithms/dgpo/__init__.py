"""DGPO, Direct Group Preference Optimization (arXiv 2510.08425), ``--algorithm dgpo`` (docs/objectives.md)."""
