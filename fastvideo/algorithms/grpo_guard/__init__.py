"""GRPO-Guard (arXiv 2510.22319): GRPO's policy loss with the ratio re-centred and normalised per
step, ``--policy_loss grpo_guard`` (docs/objectives.md)."""
