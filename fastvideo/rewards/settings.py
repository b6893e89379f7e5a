"""The reward component's settings: which rewards (with weights), their model files, where and in
which precision they score. The newer rewards' and remote judges' flags are in rewards/flags.py
(RewardExtras); MixGRPO's --reward_model selection is translated onto --rewards by fastvideo.compat."""

from __future__ import annotations

import argparse
from dataclasses import dataclass

from fastvideo.errors import ConfigError
from fastvideo.rewards.weights import default_folder
from fastvideo.settings import Settings, at_least_one, flag_group


def reward_spec(args: argparse.Namespace) -> list:
    """The trained rewards ([RewardSpec(name, weight)]) from --rewards."""
    from fastvideo.rewards.combine import parse_reward_spec

    try:
        spec = parse_reward_spec(args.rewards) if args.rewards else []
    except ValueError as exc:  # the spec parser's own errors (unknown name, bad weight)
        raise ConfigError(str(exc)) from exc
    if not spec:
        raise ConfigError('no reward given: add --rewards NAME:WEIGHT (e.g. --rewards "hpsv2:1.0" or '
                          '--rewards compressibility:1.0) or --use_hpsv2')
    return spec


# The flags of each local reward model: they have no effect while that reward is not used.
# (Rewards that share a flag share an entry: --clip_dir is read by clip and by clip_edit.)
MODEL_FLAGS = {"hpsv2": ("hps_ckpt_dir", "hps_model_name", "hps_input"),
               "pickscore": ("pickscore_dir", "pickscore_processor_dir"), "clip or clip_edit": ("clip_dir",),
               "aesthetic": ("aesthetic_dir", "aesthetic_clip_name"), "imagereward": ("image_reward_dir",),
               "videoalign": ("videoalign_dir", "videoalign_weights", "videoalign_clip_fps")}


@dataclass
class RewardSettings(Settings):
    spec: list  # [RewardSpec(name, weight)]
    group_norm: bool
    hps_ckpt_dir: str
    hps_model_name: str
    pickscore_dir: str
    pickscore_processor_dir: str | None
    clip_dir: str
    device: str
    batch_size: int
    overlap: str  # auto | on | off (see builders.overlap_reward_scoring)
    precision: str  # auto | fp16 | bf16 | fp32 (see builders.reward_dtype)
    extras: object = None  # rewards.flags.RewardExtras: newer rewards' paths, remote settings
    hps_input: str = "uint8"  # uint8 (upstream's 8-bit images) | float (fastvideo.rewards.hps)

    @classmethod
    def add_flags(cls, parser: argparse.ArgumentParser) -> None:
        g = flag_group(parser, "rewards")
        g.add_argument("--rewards", type=str, default=None,
                       help='weighted rewards, e.g. "hpsv2:1.0,pickscore:0.5" (names: hpsv2, pickscore, clip, '
                            'compressibility, aesthetic, imagereward, detail, saturation, videoalign; remote:URL/NAME:W; '
                            "vlm:URL?model=M:W; a plugin reward class: pkg.module:Name:W)")
        g.add_argument("--reward_group_norm", action="store_true",
                       help="normalise each reward within its group before weighting")
        g.add_argument("--hps_ckpt_dir", type=str, default=default_folder("hpsv2"),
                       help="folder with HPS_v2.1_compressed.pt and open_clip_pytorch_model.bin (hpsv2)")
        g.add_argument("--hps_model_name", type=str, default="ViT-H-14",
                       help="open_clip architecture of the HPS checkpoint")
        g.add_argument("--hps_input", type=str, default="uint8", choices=["uint8", "float"],
                       help="uint8: score decoded images as 8-bit images through HPS's preprocess_val, the "
                            "similarity under the reward autocast (upstream); float: skip the 8-bit rounding, "
                            "float32 similarity (alignment work)")
        g.add_argument("--pickscore_dir", type=str, default=default_folder("pickscore"),
                       help="PickScore model and processor folder (pickscore)")
        g.add_argument("--pickscore_processor_dir", type=str, default=None,
                       help="folder of PickScore's CLIP processor when it is not in --pickscore_dir")
        g.add_argument("--clip_dir", type=str, default=default_folder("clip"), help="CLIP model folder (clip, clip_edit)")
        g.add_argument("--reward_device", type=str, default="train", choices=["train", "cpu"],
                       help="score on the training device or on the CPU")
        g.add_argument("--reward_batch_size", type=int, default=8, help="images per reward-model call")
        g.add_argument("--reward_precision", type=str, default="auto", choices=["auto", "fp16", "bf16", "fp32"],
                       help="autocast dtype of model rewards (HPS, PickScore, CLIP); auto: fp16 on GPU/NPU as "
                            "upstream DanceGRPO and the Ascend recipe score, fp32 on CPU")
        g.add_argument("--reward_overlap", type=str, default="auto", choices=["auto", "on", "off"],
                       help="score each rollout chunk on a worker thread while the next chunk samples; auto: on "
                            "only when the reward runs on another device than the rollout (--reward_device cpu "
                            "with a GPU/NPU), where the two do not compete (docs/performance.md)")
        from fastvideo.rewards.flags import add_reward_flags

        add_reward_flags(parser)

    @classmethod
    def from_args(cls, args: argparse.Namespace) -> "RewardSettings":
        from fastvideo.rewards.flags import extras_from_args

        at_least_one(args, "reward_batch_size")
        return cls(
            spec=reward_spec(args), group_norm=args.reward_group_norm,
            hps_ckpt_dir=args.hps_ckpt_dir, hps_model_name=args.hps_model_name,
            pickscore_dir=args.pickscore_dir, pickscore_processor_dir=args.pickscore_processor_dir,
            clip_dir=args.clip_dir, device=args.reward_device, batch_size=args.reward_batch_size,
            overlap=args.reward_overlap, precision=args.reward_precision, extras=extras_from_args(args),
            hps_input=args.hps_input,
        ).checked()

    def check_across(self, sections: dict) -> None:
        """A reward that needs the samples' source images (rewards.base.needs_sources: clip_edit)
        refused for a family that generates from text, before any model loads."""
        from fastvideo.rewards.base import needs_sources
        from fastvideo.rewards.registry import reward_class

        model = sections.get("model")
        if model is not None and any(s.name == "videoalign" and not s.url for s in self.spec) \
                and family_makes_clips(model.family) is False:
            raise ConfigError(f"--rewards videoalign scores clips (at least 2 frames) and model family {model.family!r} "
                              "generates images: train a video family (--model_family wan) or use an image reward")
        wanting = [s.name for s in self.spec if not s.url and needs_sources(reward_class(s.name))]
        if wanting and model is not None and family_edits(model.family) is False:
            raise ConfigError(f"--rewards {', '.join(wanting)} compares each image with its source image, and model "
                              f"family {model.family!r} generates from text (no source images): train an editing "
                              f"family (--model_family kontext) on a prompt file with images, or use another reward")

    @staticmethod
    def check_served_sources(family: str, served) -> None:
        """The remote rewards whose server's /health says they need source images (``served``: the
        (spec, health record) pairs of rewards.remote.check_reward_endpoints) refused for a family that
        generates from text: one line now, not a 400 from the server at the first reward call."""
        from fastvideo.rewards.remote import redact, served_needs_sources

        wanting = [f"remote:{redact(spec.url)}" for spec, info in served if served_needs_sources(info)]
        if wanting and family_edits(family) is False:
            raise ConfigError(f"--rewards {', '.join(dict.fromkeys(wanting))}: the reward server says this reward "
                              f"compares each image with its source image (/health: uses_sources), and model family "
                              f"{family!r} generates from text (no source images): train an editing family "
                              f"(--model_family kontext) on a prompt file with images, or use another reward")

    @classmethod
    def notes(cls, args: argparse.Namespace, defaults: argparse.Namespace) -> list[str]:
        """A local reward model's flags given while no reward of that model is trained locally,
        evaluated (--eval_rewards) or guarded (--guard_reward). A remote hpsv2 reward is scored by its
        server, whose own --hps_input decides."""
        specs = reward_spec(args)
        used = {s.name for s in specs if not s.url}
        used |= {n.strip() for n in (getattr(args, "eval_rewards", None) or "").split(",")}
        used.add(getattr(args, "guard_reward", None))
        remote = {s.name for s in specs if s.url}
        notes = []
        for reward, flags in MODEL_FLAGS.items():
            given = [f for f in flags if hasattr(args, f) and getattr(args, f) != getattr(defaults, f)]
            if not given or used.intersection(reward.split(" or ")):
                continue
            if reward == "hpsv2" and "hpsv2" in remote and "hps_input" in given:
                notes.append(f"--hps_input {args.hps_input} does not reach a remote hpsv2 reward: start the reward "
                             f"server with --hps_input {args.hps_input}")
                given = [f for f in given if f != "hps_input"]
                if not given:
                    continue
            shown = [f"--{f} {getattr(args, f)}" for f in given]
            notes.append(f"{', '.join(shown)} {'has' if len(given) == 1 else 'have'} no effect without the "
                         f"{reward} reward")
        return notes

    @classmethod
    def flags_from_resolved(cls, section: dict) -> dict:
        """spec entries: "name:weight" / "kind:url:weight" strings (config.json) or RewardSpec dicts."""
        from fastvideo.rewards.flags import extras_flags

        names = ("hps_ckpt_dir", "hps_model_name", "pickscore_dir", "pickscore_processor_dir", "clip_dir")
        return {"rewards": ",".join(spec_text(s) for s in section["spec"]), "reward_group_norm": section["group_norm"],
                **{n: section[n] for n in names}, "reward_device": section["device"],
                "reward_batch_size": section["batch_size"], "reward_overlap": section["overlap"],
                "reward_precision": section["precision"], **extras_flags(section["extras"]),
                # a config.json from before the flag scored float images
                "hps_input": section.get("hps_input", "float")}


def spec_text(spec) -> str:
    """One --rewards entry for a RewardSpec (or its dict, or its text), its weight written exactly."""
    if isinstance(spec, str):
        return spec
    s = spec if isinstance(spec, dict) else vars(spec)
    head = f"{s['kind']}:{s['url']}" if s["url"] else s["name"]
    return f"{head}:{s['weight']:.17g}"


def family_edits(family: str) -> bool | None:
    """Whether model family ``family`` edits (its samples have source images); None when the family
    is unknown or of the other library line (the model settings say so)."""
    from fastvideo.errors import UserError
    from fastvideo.models.registry import family_factory

    try:
        return bool(getattr(family_factory(family), "edits", False))
    except UserError:
        return None


def family_makes_clips(family: str) -> bool | None:
    """Whether model family ``family`` generates clips (it has a ``video_fps``); None when unknown."""
    from fastvideo.errors import UserError
    from fastvideo.models.registry import family_factory

    try:
        return getattr(family_factory(family), "video_fps", None) is not None
    except UserError:
        return None
