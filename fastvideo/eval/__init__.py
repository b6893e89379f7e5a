"""Evaluation on held-out prompts with fixed noise, during training and standalone.

settings.py owns the --eval_* and --guard_* flags; prompts.py reads and encodes the prompt set;
core.py samples and scores (spread over ranks); report.py writes eval.jsonl, grids and curves;
loop.py is what the trainer calls. The reward-hacking guard is fastvideo/training/run/guard.py.
"""
