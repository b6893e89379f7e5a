"""MixGRPO's reward selection, path and bookkeeping flags, so its launch lines run unchanged.

    --reward_model multi_reward --hps_weight 1 --image_reward_weight 1 --pick_score_weight 1
    --multi_reward_mix advantage_aggr|reward_aggr [--unified_reward_url http://host:port[,...]]

becomes the reward component's own flags: ``--rewards`` with MixGRPO's rewards and its weights
divided by their sum (as MixGRPO does), several judge servers joined with ``|`` in one vlm: entry,
and ``--reward_mix`` (the two mixes are defined in fastvideo.rewards.advantages). Its model paths
become our folder flags and the rest is noted as having no effect. Its window / solver flags live with their code in
fastvideo.sampling.mix; its KL term, trimming and sample reordering in the GRPO objective's settings
(fastvideo.algorithms.settings).
"""

from __future__ import annotations

import argparse
import os

from fastvideo.errors import ConfigError
from fastvideo.rewards.flags import MIX_MODES
from fastvideo.settings import flag_group

_INERT_STRINGS = {None, "", "None", "none", "null"}
# MixGRPO's --reward_model choices -> its reward names, in its order.
REWARD_MODELS = {
    "hpsv2": ("hpsv2",),
    "image_reward": ("image_reward",),
    "clip_score": ("clip_score",),
    "pick_score": ("pick_score",),
    "unified_reward": ("unified_reward",),
    "hpsv2_clip_score": ("hpsv2", "clip_score"),
    "multi_reward": ("hpsv2", "image_reward", "pick_score", "unified_reward"),
}
# MixGRPO reward -> (our reward name, its weight flag)
OURS = {
    "hpsv2": ("hpsv2", "hps_weight"),
    "image_reward": ("imagereward", "image_reward_weight"),
    "clip_score": ("clip", "clip_score_weight"),
    "pick_score": ("pickscore", "pick_score_weight"),
    "unified_reward": ("vlm", "unified_reward_weight"),
}
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


def _add_reward_flags(parser: argparse.ArgumentParser) -> None:
    g = flag_group(parser, "MixGRPO reward selection (becomes --rewards and --reward_mix)")
    g.add_argument("--reward_model", type=str, default=None, choices=sorted(REWARD_MODELS),
                   help="MixGRPO's reward selection; instead of --rewards")
    g.add_argument("--multi_reward_mix", type=str, default=None, choices=MIX_MODES,
                   help="MixGRPO's name of --reward_mix (default with --reward_model: advantage_aggr)")
    for _, flag in OURS.values():
        g.add_argument(f"--{flag}", type=float, default=1.0, help="MixGRPO weight (weights are divided by their sum)")
    g.add_argument("--unified_reward_url", type=str, default=None,
                   help="UnifiedReward server root(s), comma-separated (rank r uses URL r mod n); served "
                        "as vlm:URL/v1?model=--unified_reward_model; None (as MixGRPO's scripts pass) means no judge")
    g.add_argument("--unified_reward_model", type=str, default="UnifiedReward",
                   help="model name the UnifiedReward server expects (MixGRPO sends 'UnifiedReward')")


def add_flags(parser: argparse.ArgumentParser) -> None:
    _add_reward_flags(parser)
    g = flag_group(parser, "MixGRPO compatibility (paths, bookkeeping)")
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
    used = set(REWARD_MODELS.get(args.reward_model, ()))
    names = [flag for reward, (_, flag) in OURS.items() if reward not in used]
    if "unified_reward" not in used:
        names += ["unified_reward_model"] + ([] if _judge_urls(args) is None else ["unified_reward_url"])
    if args.reward_model is None:
        names += list(_PATHS)
    elif args.reward_model not in _CLIP_MODELS:
        names.append("clip_score_path")
    return [f"--{n}" for n in names if getattr(args, n) != getattr(defaults, n)]


def translate(args: argparse.Namespace, defaults: argparse.Namespace) -> tuple[dict, list[str]]:
    """(flag values to use instead, notes); ConfigError for MixGRPO settings not implemented."""
    notes = _no_effect_notes(args, defaults)
    unused = _unused_reward_flags(args, defaults)
    if unused:
        why = (f"--reward_model {args.reward_model} does not use them" if args.reward_model else
               "they belong to MixGRPO's --reward_model; with --rewards give --hps_ckpt_dir, --clip_dir, "
               "--image_reward_dir")
        notes.append(f"{', '.join(unused)}: accepted for MixGRPO compatibility, no effect here: {why}")
    if args.reward_model is None:
        if args.multi_reward_mix is not None:
            raise ConfigError("--multi_reward_mix needs --reward_model (MixGRPO's reward selection); with --rewards "
                              "give --reward_mix")
        return {}, notes
    changes, path_notes = _map_paths(args)
    changes.update(_reward_changes(args))
    return changes, path_notes + notes


def _judge_urls(args: argparse.Namespace) -> list[str] | None:
    """--unified_reward_url's servers; None when absent (MixGRPO's scripts pass the string None)."""
    if args.unified_reward_url in _INERT_STRINGS:
        return None
    urls = [u.strip().rstrip("/") for u in args.unified_reward_url.split(",") if u.strip()]
    return urls or None


def mixgrpo_specs(args: argparse.Namespace) -> list[str]:
    """--reward_model and the weight flags -> --rewards entries with weights divided by their sum.
    unified_reward is included when --unified_reward_url is given (required when it is the only
    reward); several judge servers share one vlm: entry, joined with ``|``: which one a rank asks
    is chosen when the reward is built (training.builders.rank_reward_specs), so the
    configuration is the same on every rank."""
    names = list(REWARD_MODELS[args.reward_model])
    urls = _judge_urls(args)
    if "unified_reward" in names and urls is None:
        if args.reward_model == "unified_reward":
            raise ConfigError("--reward_model unified_reward needs --unified_reward_url http://host:port")
        names.remove("unified_reward")
    weights = {n: getattr(args, OURS[n][1]) for n in names}
    total = sum(weights.values())
    if not total > 0:
        raise ConfigError(f"MixGRPO reward weights {weights} must have a positive sum")
    entries = []
    for n in names:
        ours, _ = OURS[n]
        head = ours
        if ours == "vlm":
            head = "vlm:" + "|".join(f"{u}/v1?model={args.unified_reward_model}" for u in urls)
        entries.append(f"{head}:{weights[n] / total:.17g}")
    return entries


def _reward_changes(args: argparse.Namespace) -> dict:
    """MixGRPO's reward selection as the reward component's flags (--rewards, --reward_mix)."""
    if args.rewards or args.use_hpsv2 or args.use_pickscore:
        raise ConfigError("give the rewards either with --reward_model (MixGRPO) or with --rewards / "
                          "--use_hpsv2 / --use_pickscore, not both")
    if args.reward_mix is not None:
        raise ConfigError("give --multi_reward_mix (MixGRPO) or --reward_mix, not both")
    return {"rewards": ",".join(mixgrpo_specs(args)), "reward_mix": args.multi_reward_mix or "advantage_aggr"}
