"""MixGRPO's path and bookkeeping flags, so its launch lines run unchanged.

Its reward selection (--reward_model, the weight flags, --multi_reward_mix, --unified_reward_url)
is mapped onto --rewards by fastvideo.rewards.mix; its window / solver flags live with their code
in fastvideo.sampling.mix. Here: its model paths become our folder flags, what is not implemented
is refused (its own KL term, trimmed advantages: a non-zero value fails), and the rest is noted
as having no effect.
"""

from __future__ import annotations

import argparse
import os

from fastvideo.errors import ConfigError
from fastvideo.settings import flag_group

_INERT_STRINGS = {None, "", "None", "none", "null"}
# Flags that change nothing here, and why (a start-up note when one is given).
NO_EFFECT = {
    "experiment_name": "outputs go to --output_dir",
    "wandb_key": "log in to wandb the usual way (WANDB_API_KEY or wandb login)",
    "image_reward_http_proxy": "no model hub is used", "image_reward_https_proxy": "no model hub is used",
    "pick_score_http_proxy": "no model hub is used", "pick_score_https_proxy": "no model hub is used",
    "unified_reward_default_question_type": "the vlm: judge asks one question, its template (the default, or "
                                            "prompt=FILE in the vlm: URL; fastvideo/rewards/vlm.py)",
}
_PATHS = ("hps_path", "hps_clip_path", "clip_score_path", "image_reward_path", "image_reward_med_config")
_CLIP_MODELS = ("clip_score", "hpsv2_clip_score")


def add_flags(parser: argparse.ArgumentParser) -> None:
    g = flag_group(parser, "MixGRPO compatibility (paths, bookkeeping; its reward selection is "
                           "in fastvideo.rewards.mix)")
    g.add_argument("--hps_path", type=str, default=None,
                   help="HPS_v2.1_compressed.pt; its folder (with open_clip_pytorch_model.bin) becomes --hps_ckpt_dir")
    g.add_argument("--hps_clip_path", type=str, default=None, help="open_clip_pytorch_model.bin next to --hps_path")
    g.add_argument("--clip_score_path", type=str, default=None, help="a local CLIP folder (becomes --clip_dir)")
    g.add_argument("--image_reward_path", type=str, default=None,
                   help="ImageReward.pt; its folder becomes --image_reward_dir")
    g.add_argument("--image_reward_med_config", type=str, default=None,
                   help="med_config.json; must be the one next to --image_reward_path")
    for name in ("image_reward_http_proxy", "image_reward_https_proxy", "pick_score_http_proxy",
                 "pick_score_https_proxy", "unified_reward_default_question_type", "wandb_key"):
        g.add_argument(f"--{name}", type=str, default=None, help="MixGRPO compatibility; no effect here")
    g.add_argument("--unified_reward_num_workers", type=int, default=1,
                   help="MixGRPO compatibility; requests to the judge run --vlm_concurrency at a time")
    g.add_argument("--experiment_name", type=str, default=None,
                   help="MixGRPO's run name; outputs go to --output_dir here")
    g.add_argument("--kl_coeff", type=float, default=0.0,
                   help="MixGRPO's KL coefficient (its own KL term, not implemented): only 0 is accepted; this "
                        "trainer's KL penalty is --kl_coef")
    g.add_argument("--trimmed_ratio", type=float, default=0.0, help="trimmed advantages; only 0 is supported")
    g.add_argument("--advantage_rerange_strategy", type=str, default="null", choices=["null"],
                   help="MixGRPO's advantage re-ordering; only null")
    g.add_argument("--drop_last_sample", action="store_true",
                   help="decode the last step's x0 prediction: always the case here (upstream DanceGRPO)")


def _hps_dir(args: argparse.Namespace) -> str:
    folder = os.path.dirname(args.hps_path) or "."
    if args.hps_clip_path and (os.path.dirname(args.hps_clip_path) or ".") != folder:
        raise ConfigError(f"--hps_path {args.hps_path} and --hps_clip_path {args.hps_clip_path} must be in one "
                          "folder (it becomes --hps_ckpt_dir)")
    if os.path.basename(args.hps_path) != "HPS_v2.1_compressed.pt":
        raise ConfigError(f"--hps_path {args.hps_path}: the file must be named HPS_v2.1_compressed.pt")
    return folder


def _image_reward_dir(args: argparse.Namespace) -> str:
    if os.path.basename(args.image_reward_path) != "ImageReward.pt":
        raise ConfigError(f"--image_reward_path {args.image_reward_path}: the file must be named ImageReward.pt")
    return os.path.dirname(args.image_reward_path) or "."


def _check_med_config(args: argparse.Namespace, folder: str) -> None:
    """ImageReward reads med_config.json from its folder; another file cannot be honoured."""
    med = args.image_reward_med_config
    if os.path.basename(med) != "med_config.json" or os.path.abspath(os.path.dirname(med) or ".") != \
            os.path.abspath(folder):
        raise ConfigError(f"--image_reward_med_config {med}: ImageReward reads med_config.json from its folder "
                          f"{folder} (--image_reward_dir / the folder of --image_reward_path); put the file there "
                          "and drop this flag")


def _map_paths(args: argparse.Namespace) -> tuple[dict, list[str]]:
    changes, notes = {}, []
    if args.hps_path:
        changes["hps_ckpt_dir"] = _hps_dir(args)
        notes.append(f"--hps_path: using --hps_ckpt_dir {changes['hps_ckpt_dir']}")
    if args.image_reward_path:
        changes["image_reward_dir"] = _image_reward_dir(args)
        notes.append(f"--image_reward_path: using --image_reward_dir {changes['image_reward_dir']}")
    if args.image_reward_med_config:
        _check_med_config(args, changes.get("image_reward_dir", args.image_reward_dir))
    if args.reward_model in _CLIP_MODELS and args.clip_score_path:
        if args.clip_score_path.startswith("hf-hub:"):
            raise ConfigError(f"--clip_score_path {args.clip_score_path}: no model hub here; put the CLIP model "
                              "in a folder and pass that folder")
        changes["clip_dir"] = args.clip_score_path
    return changes, notes


def _no_effect_notes(args: argparse.Namespace, defaults: argparse.Namespace) -> list[str]:
    notes = [f"--{name} is accepted for MixGRPO compatibility and has no effect: {why}"
             for name, why in NO_EFFECT.items() if getattr(args, name) not in _INERT_STRINGS]
    if args.unified_reward_num_workers != defaults.unified_reward_num_workers:
        notes.append("--unified_reward_num_workers is accepted for MixGRPO compatibility and has no effect: "
                     "requests to a vlm: judge run --vlm_concurrency at a time")
    if args.drop_last_sample:
        notes.append("--drop_last_sample is accepted for MixGRPO compatibility and has no effect: the image is "
                     "always decoded from the last step's x0 prediction here (as upstream DanceGRPO)")
    return notes


def _unused_reward_flags(args: argparse.Namespace, defaults: argparse.Namespace) -> list[str]:
    """MixGRPO's reward flags given a value although --reward_model (or its absence) does not read them."""
    from fastvideo.rewards.mix import OURS, REWARD_MODELS

    used = set(REWARD_MODELS.get(args.reward_model, ()))
    names = [flag for reward, (_, flag) in OURS.items() if reward not in used]
    if "unified_reward" not in used:
        names += ["unified_reward_url", "unified_reward_model"]
    if args.reward_model is None:
        names += list(_PATHS)
    elif args.reward_model not in _CLIP_MODELS:
        names.append("clip_score_path")
    return [f"--{n}" for n in names if getattr(args, n) != getattr(defaults, n)]


def translate(args: argparse.Namespace, defaults: argparse.Namespace) -> tuple[dict, list[str]]:
    """(flag values to use instead, notes); ConfigError for MixGRPO settings not implemented."""
    if args.kl_coeff != 0.0:
        raise ConfigError(f"--kl_coeff {args.kl_coeff}: MixGRPO's KL term is not implemented; use 0 (MixGRPO's "
                          "scripts do), or this trainer's --kl_coef (KL of each SDE step to the frozen base)")
    if args.trimmed_ratio != 0.0:
        raise ConfigError(f"--trimmed_ratio {args.trimmed_ratio}: trimmed advantages are not implemented; use 0")
    notes = _no_effect_notes(args, defaults)
    unused = _unused_reward_flags(args, defaults)
    if unused:
        why = (f"--reward_model {args.reward_model} does not use them" if args.reward_model else
               "they belong to MixGRPO's --reward_model; with --rewards give --hps_ckpt_dir, --clip_dir, "
               "--image_reward_dir")
        notes.append(f"{', '.join(unused)}: accepted for MixGRPO compatibility, no effect here: {why}")
    if args.reward_model is None:
        return {}, notes
    changes, path_notes = _map_paths(args)
    return changes, path_notes + notes
