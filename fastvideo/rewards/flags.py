"""Flags of the reward models added after the first four, of remote rewards, and of how several
rewards become advantages (--reward_mix); part of the reward component (fastvideo/rewards/settings.py)
and of the reward server. MixGRPO's reward flags are translated onto these by fastvideo.compat.

The typed result is :class:`RewardExtras` (TrainConfig.reward.extras); builders.build_rewards
turns it into per-reward constructor arguments with :func:`reward_kwargs`.
"""

from __future__ import annotations

import argparse
import math
from dataclasses import dataclass

from fastvideo.errors import ConfigError
from fastvideo.rewards.frames import parse_frame_selection
from fastvideo.rewards.weights import default_folder

# rewards.advantages.MIX_MODES (that module imports torch; tests/rewards check the two agree).
MIX_MODES = ("advantage_aggr", "reward_aggr")


@dataclass
class RewardExtras:
    aesthetic_dir: str = default_folder("aesthetic")
    aesthetic_clip_name: str = "ViT-L-14-quickgelu"
    image_reward_dir: str = default_folder("imagereward")
    remote_timeout_s: float = 120.0
    remote_retries: int = 3
    vlm_concurrency: int = 8
    vlm_timeout_s: float = 120.0
    multi_reward_mix: str | None = None  # --reward_mix: advantage_aggr | reward_aggr, None: weighted sum
    video_reward_frames: str = "all"  # which frames of a clip image rewards score (rewards/video.py)
    videoalign_dir: str = default_folder("videoalign")
    videoalign_weights: tuple = (1.0, 1.0, 1.0)  # VQ, MQ, TA (upstream's Overall: 1, 1, 1)
    videoalign_clip_fps: float | None = None  # the clips' frame rate; None: the trained family's (16 in a server)


def add_reward_flags(p: argparse.ArgumentParser, client: bool = True) -> None:
    """The newer rewards' file flags; with client=True (the trainer) also the remote:/vlm: client
    settings and --reward_mix (a reward server takes only the file flags)."""
    g = p.add_argument_group("more rewards (aesthetic, imagereward, remote:, vlm:)")
    g.add_argument("--aesthetic_dir", type=str, default=RewardExtras.aesthetic_dir,
                   help="folder with sac+logos+ava1-l14-linearMSE.pth and the CLIP ViT-L/14 weights "
                        "(open_clip_pytorch_model.bin) for --rewards aesthetic")
    g.add_argument("--aesthetic_clip_name", type=str, default=RewardExtras.aesthetic_clip_name,
                   help="open_clip architecture of those CLIP weights")
    g.add_argument("--image_reward_dir", type=str, default=RewardExtras.image_reward_dir,
                   help="folder with ImageReward.pt, med_config.json and the bert-base-uncased "
                        "tokenizer files (vocab.txt) for --rewards imagereward")
    g.add_argument("--videoalign_dir", type=str, default=RewardExtras.videoalign_dir,
                   help="VideoReward folder (model_config.json, checkpoint-N/, Qwen2-VL-2B-Instruct/) for --rewards "
                        "videoalign")
    g.add_argument("--videoalign_weights", type=str, default="1,1,1",
                   help="VQ,MQ,TA: weights of VideoAlign's three normalised heads (default: upstream's Overall, "
                        "their sum)")
    g.add_argument("--videoalign_clip_fps", type=float, default=RewardExtras.videoalign_clip_fps,
                   help="frame rate of the scored clips (VideoAlign samples its fps of them); default: the "
                        "trained family's (Wan2.1 and A14B 16, Wan2.2-TI2V-5B 24, HunyuanVideo 15); a reward "
                        "server, which does not know the family: 16")
    if not client:
        return
    g.add_argument("--reward_timeout", type=float, default=RewardExtras.remote_timeout_s,
                   help="seconds one request to a remote: reward server may take")
    g.add_argument("--reward_retries", type=int, default=RewardExtras.remote_retries,
                   help="retries (exponential backoff from 0.5 s) of a failed remote:/vlm: request")
    g.add_argument("--vlm_concurrency", type=int, default=RewardExtras.vlm_concurrency,
                   help="requests in flight at once to a vlm: judge")
    g.add_argument("--vlm_timeout", type=float, default=RewardExtras.vlm_timeout_s,
                   help="seconds one vlm: judge request may take")
    g.add_argument("--reward_mix", type=str, default=None, choices=MIX_MODES,
                   help="turn several rewards into advantages as MixGRPO does (fastvideo/rewards/advantages.py): "
                        "advantage_aggr (each reward's group advantages, weighted) or reward_aggr (the weighted "
                        "reward, group-normalised); default: the weighted sum of --rewards. Needs --use_group")
    g.add_argument("--video_reward_frames", type=str, default=RewardExtras.video_reward_frames,
                   help="a video family's clips: the frames each image reward scores, averaged per clip: all, first "
                        "or every:K (frames 0, K, 2K, ...); a clip reward (takes_clips) gets whole clips; an image "
                        "is a one-frame clip (default: all)")


def extras_from_args(args: argparse.Namespace) -> RewardExtras:
    """Validated RewardExtras; raises ConfigError naming the flag. Client flags a parser did not
    define (a reward server's) keep their defaults."""
    videoalign = videoalign_extras(args)
    if not hasattr(args, "reward_timeout"):
        return RewardExtras(aesthetic_dir=args.aesthetic_dir, aesthetic_clip_name=args.aesthetic_clip_name,
                            image_reward_dir=args.image_reward_dir, **videoalign)
    for flag in ("reward_timeout", "vlm_timeout"):
        if not getattr(args, flag) > 0:
            raise ConfigError(f"--{flag} must be positive; got {getattr(args, flag)}")
    if args.reward_retries < 0:
        raise ConfigError(f"--reward_retries must be >= 0; got {args.reward_retries}")
    if args.vlm_concurrency < 1:
        raise ConfigError(f"--vlm_concurrency must be >= 1; got {args.vlm_concurrency}")
    return RewardExtras(
        aesthetic_dir=args.aesthetic_dir, aesthetic_clip_name=args.aesthetic_clip_name,
        image_reward_dir=args.image_reward_dir, remote_timeout_s=args.reward_timeout,
        remote_retries=args.reward_retries, vlm_concurrency=args.vlm_concurrency,
        vlm_timeout_s=args.vlm_timeout, multi_reward_mix=mix_mode(args),
        video_reward_frames=str(parse_frame_selection(args.video_reward_frames)), **videoalign,
    )


def videoalign_extras(args: argparse.Namespace) -> dict:
    """--videoalign_dir, --videoalign_weights (three numbers) and --videoalign_clip_fps, checked."""
    parts = [w.strip() for w in str(args.videoalign_weights).split(",")]
    try:
        weights = tuple(float(w) for w in parts)
    except ValueError:
        weights = ()
    if len(weights) != 3 or not all(math.isfinite(w) for w in weights):
        raise ConfigError(f"--videoalign_weights takes three numbers VQ,MQ,TA (e.g. 1,1,1); got "
                          f"{args.videoalign_weights!r}")
    fps = args.videoalign_clip_fps
    if fps is not None and not fps > 0:
        raise ConfigError(f"--videoalign_clip_fps must be positive; got {fps}")
    return {"videoalign_dir": args.videoalign_dir, "videoalign_weights": weights,
            "videoalign_clip_fps": None if fps is None else float(fps)}


def extras_flags(extras: dict) -> dict:
    """The flags that extras_from_args turns back into ``extras`` (RewardExtras as a dict)."""
    names = ("aesthetic_dir", "aesthetic_clip_name", "image_reward_dir", "vlm_concurrency")
    return {**{n: extras[n] for n in names}, "reward_mix": extras["multi_reward_mix"],
            "reward_timeout": extras["remote_timeout_s"],
            "reward_retries": extras["remote_retries"], "vlm_timeout": extras["vlm_timeout_s"],
            "video_reward_frames": extras.get("video_reward_frames", "all"),  # absent before video families
            **{k: extras.get(k, getattr(RewardExtras, k)) for k in ("videoalign_dir", "videoalign_clip_fps")},
            "videoalign_weights": ",".join(f"{w:.17g}" for w in extras.get("videoalign_weights", (1.0, 1.0, 1.0)))}


def mix_mode(args: argparse.Namespace) -> str | None:
    """--reward_mix, checked: it replaces --reward_group_norm and needs groups (--use_group), as
    in MixGRPO."""
    mode = args.reward_mix
    if mode is None:
        return None
    if getattr(args, "reward_group_norm", False):
        raise ConfigError(f"--reward_group_norm does not apply with --reward_mix {mode} (MixGRPO's "
                          "--multi_reward_mix), which normalises the MixGRPO way; drop it")
    if not getattr(args, "use_group", True):
        raise ConfigError(f"--reward_mix {mode} (MixGRPO's --multi_reward_mix) needs --use_group")
    return mode


def model_reward_kwargs(flags, extras: RewardExtras) -> dict[str, dict]:
    """Per-reward constructor arguments of every reward model from its file flags: ``flags`` has
    hps_ckpt_dir, hps_model_name, hps_input, pickscore_dir, pickscore_processor_dir and clip_dir
    (the trainer's RewardSettings, or a reward server's parsed flags), ``extras`` the newer ones.
    The trainer and the reward server read this one table, so a flag reaches a reward in both."""
    return {
        "hpsv2": {"hps_ckpt_dir": flags.hps_ckpt_dir, "model_name": flags.hps_model_name,
                  "input_precision": flags.hps_input},
        "pickscore": {"pickscore_dir": flags.pickscore_dir, "processor_dir": flags.pickscore_processor_dir},
        "clip": {"clip_dir": flags.clip_dir},
        "clip_edit": {"clip_dir": flags.clip_dir},
        **reward_kwargs(extras),
    }


def reward_kwargs(extras: RewardExtras) -> dict[str, dict]:
    """Per-reward constructor arguments (see rewards.combine.build_multi_reward)."""
    return {
        "aesthetic": {"aesthetic_dir": extras.aesthetic_dir,
                      "clip_model_name": extras.aesthetic_clip_name},
        "imagereward": {"image_reward_dir": extras.image_reward_dir},
        "videoalign": {"videoalign_dir": extras.videoalign_dir, "weights": tuple(extras.videoalign_weights),
                       **({} if extras.videoalign_clip_fps is None else {"clip_fps": extras.videoalign_clip_fps})},
        "remote": {"timeout_s": extras.remote_timeout_s, "retries": extras.remote_retries},
        "vlm": {"timeout_s": extras.vlm_timeout_s, "concurrency": extras.vlm_concurrency,
                "retries": extras.remote_retries},
    }
