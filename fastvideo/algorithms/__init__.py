"""Training objectives (policy-gradient algorithms) and their settings."""
