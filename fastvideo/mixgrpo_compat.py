"""MixGRPO's reward and bookkeeping flags, so its launch lines run unchanged.

Its reward selection (--reward_model, the weight flags, --multi_reward_mix, --unified_reward_url)
is mapped onto --rewards by fastvideo.rewards.mix; this module maps its path flags onto ours and
refuses what is not implemented (MixGRPO's own KL term and trimmed advantages: a non-zero value fails). The window / solver flags live
with their code in fastvideo.sampling.mix.
"""

from __future__ import annotations

import argparse
import os

_INERT_STRINGS = {None, "", "None", "none", "null"}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    g = parser.add_argument_group("MixGRPO compatibility (paths, bookkeeping; its reward selection is "
                                  "in fastvideo.rewards.mix)")
    g.add_argument("--hps_path", type=str, default=None,
                   help="HPS_v2.1_compressed.pt; its folder (with open_clip_pytorch_model.bin) becomes --hps_ckpt_dir")
    g.add_argument("--hps_clip_path", type=str, default=None, help="open_clip_pytorch_model.bin next to --hps_path")
    g.add_argument("--clip_score_path", type=str, default=None, help="a local CLIP folder (becomes --clip_dir)")
    for name in ("image_reward_path", "image_reward_med_config", "image_reward_http_proxy",
                 "image_reward_https_proxy", "pick_score_http_proxy", "pick_score_https_proxy",
                 "unified_reward_default_question_type", "wandb_key"):
        g.add_argument(f"--{name}", type=str, default=None, help="MixGRPO compatibility; see --reward_model")
    g.add_argument("--unified_reward_num_workers", type=int, default=1, help="MixGRPO compatibility")
    g.add_argument("--experiment_name", type=str, default=None,
                   help="MixGRPO's run name; outputs go to --output_dir here")
    g.add_argument("--kl_coeff", type=float, default=0.0, help="KL penalty; only 0 is supported")
    g.add_argument("--trimmed_ratio", type=float, default=0.0, help="trimmed advantages; only 0 is supported")
    g.add_argument("--advantage_rerange_strategy", type=str, default="null", choices=["null"],
                   help="MixGRPO's advantage re-ordering; only null")
    g.add_argument("--drop_last_sample", action="store_true",
                   help="decode the last step's x0 prediction: always the case here (upstream DanceGRPO)")


def _map_paths(args: argparse.Namespace, fail) -> list[str]:
    notes = []
    if args.hps_path:
        folder = os.path.dirname(args.hps_path) or "."
        if args.hps_clip_path and (os.path.dirname(args.hps_clip_path) or ".") != folder:
            fail(f"--hps_path {args.hps_path} and --hps_clip_path {args.hps_clip_path} must be in one folder "
                 "(it becomes --hps_ckpt_dir)")
        if os.path.basename(args.hps_path) != "HPS_v2.1_compressed.pt":
            fail(f"--hps_path {args.hps_path}: the file must be named HPS_v2.1_compressed.pt")
        args.hps_ckpt_dir = folder
        notes.append(f"--hps_path: using --hps_ckpt_dir {folder}")
    if args.image_reward_path:
        if os.path.basename(args.image_reward_path) != "ImageReward.pt":
            fail(f"--image_reward_path {args.image_reward_path}: the file must be named ImageReward.pt")
        args.image_reward_dir = os.path.dirname(args.image_reward_path) or "."
        notes.append(f"--image_reward_path: using --image_reward_dir {args.image_reward_dir}")
    uses_clip = args.reward_model in ("clip_score", "hpsv2_clip_score")
    if uses_clip and args.clip_score_path:
        if args.clip_score_path.startswith("hf-hub:"):
            fail(f"--clip_score_path {args.clip_score_path}: no model hub here; put the CLIP model in a folder "
                 "and pass that folder")
        args.clip_dir = args.clip_score_path
    return notes


def check_and_notes(args: argparse.Namespace, fail) -> list[str]:
    """Fail on MixGRPO flags that would change the algorithm in ways not implemented; map paths;
    return notes for the start-up log."""
    if args.kl_coeff != 0.0:
        fail(f"--kl_coeff {args.kl_coeff}: MixGRPO's KL term is not implemented; use 0 (MixGRPO's scripts do), "
             "or this trainer's --kl_coef (KL of each SDE step to the frozen base)")
    if args.trimmed_ratio != 0.0:
        fail(f"--trimmed_ratio {args.trimmed_ratio}: trimmed advantages are not implemented; use 0")
    from fastvideo.config import build_parser
    from fastvideo.sampling.mix import unused_flag_notes

    defaults = build_parser().parse_args(["--data_json_path", "x", "--pretrained_model_name_or_path", "x"])
    notes = unused_flag_notes(args, defaults)
    if args.training_strategy == "part" or args.sde_steps:
        notes.append("--timestep_fraction does not apply to an SDE window: every window step is trained (as MixGRPO)")
    if args.reward_model is None:
        return notes
    notes += _map_paths(args, fail)
    for name in ("experiment_name", "wandb_key", "image_reward_http_proxy",
                 "image_reward_https_proxy", "pick_score_http_proxy", "pick_score_https_proxy"):
        if getattr(args, name) not in _INERT_STRINGS:
            notes.append(f"--{name} is accepted for MixGRPO compatibility and has no effect")
    return notes
