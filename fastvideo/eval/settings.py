"""The evaluation and guard settings; they live in fastvideo/component_settings/eval.py (so that
fastvideo.config composes them without importing fastvideo.eval) and are re-exported here."""

from fastvideo.component_settings.eval import (
    GUARD_ACTIONS,
    EvalSettings,
    GuardSettings,
    add_eval_args,
    eval_settings_from_args,
)

__all__ = ["GUARD_ACTIONS", "EvalSettings", "GuardSettings", "add_eval_args", "eval_settings_from_args"]
