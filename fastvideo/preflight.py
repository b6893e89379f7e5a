"""The configuration check a launcher runs once, in one process, before torchrun spawns a rank.

It collects EVERY problem it can find instead of stopping at the first: unknown flags (with the
nearest known name), bad values, the rules of the settings, the embedding index, the model and VAE
folders, the checkpoint to resume from, the reward weights and endpoints, the output folder, and
the world size against the devices of this node. Each problem is one line;
fastvideo.launch prints them and exits 2 without starting a worker.

    python -m fastvideo.preflight --nproc_per_node 2 -- fastvideo/train_grpo_flux.py [flags]
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from typing import Callable

from fastvideo import flag_check
from fastvideo.errors import UserError

# The entry points whose flags this module checks (others are started unchecked).
TRAINING_SCRIPTS = {"train_grpo_flux.py": (), "train_grpo_flux_lora.py": ("--use_lora",)}
# The preprocessing entry point, checked by check_preprocess, and the name its lines give.
PREPROCESS_SCRIPTS = {"preprocess_embeddings.py": "preprocess_embeddings"}


def one_line(text: str) -> str:
    return " ".join(part.strip() for part in str(text).splitlines() if part.strip())


def parse_all(argv: list[str]) -> tuple[argparse.Namespace | None, list[str]]:
    """(the parsed flags or None, every parse problem): fastvideo.flag_check.parse_all with the
    trainer's parser (the same check fastvideo.config.parse_config runs)."""
    from fastvideo.config import build_parser, resolved_flags

    return flag_check.parse_all(argv, build_parser, resolved_flags)


def _attempt(problems: list[str], check: Callable[[], object]) -> object:
    """Run ``check``; a UserError (or a missing file) becomes one problem line."""
    try:
        return check()
    except (UserError, OSError, ValueError) as exc:
        problems.append(one_line(exc))
        return None


def data_problems(data, cfg, world: int) -> list[str]:
    """The embedding index against the run: enough prompts for one iteration of ``world`` ranks.
    (Its files are scanned by the ranks, each a share: fastvideo/data/scan.py.)"""
    from fastvideo.data.sampler import too_few_prompts

    if cfg is not None and world > 0 and len(data) < world * cfg.prompts_per_rank:
        return [too_few_prompts(len(data), world, cfg.prompts_per_rank)]
    return []


def file_problems(args: argparse.Namespace, cfg, world: int = 0) -> list[str]:
    """The inputs the flags name: embedding index (and its files), model and VAE folders, resume
    checkpoint, reward weights (``cfg``: the built TrainConfig, or None when the flags did not
    validate; ``world``: ranks in all, 0 when unknown)."""
    from fastvideo.models.registry import get_model_family
    from fastvideo.models.settings import check_family_name

    problems: list[str] = []
    # a malformed name: the configuration check's own line (check_training keeps one of the two)
    family = _attempt(problems, lambda: check_family_name(args.model_family) or get_model_family(args.model_family))
    if family is not None:
        from fastvideo.data.dataset import PromptEmbeddingDataset

        data = _attempt(problems, lambda: PromptEmbeddingDataset(args.data_json_path, family=family))
        if data is not None:
            problems += data_problems(data, cfg, world)
        found = True
        if not args.dit_model_name_or_path:
            found = _attempt(problems, lambda: family.check_folder(args.pretrained_model_name_or_path,
                                                                   family.training_components)) is not None
        vae = getattr(args, "vae_model_path", None)
        if vae and vae != args.pretrained_model_name_or_path:
            found = _attempt(problems, lambda: family.check_folder(vae, ("vae",))) is not None and found
        if found:  # damaged config.json or weights (read from their headers)
            from fastvideo.models.file_check import model_file_problems, training_folders

            problems += model_file_problems(family, training_folders(family, args.pretrained_model_name_or_path,
                                                                     args.dit_model_name_or_path, vae))
    if args.resume_from_checkpoint:
        from fastvideo.training import checkpoint

        _attempt(problems, lambda: checkpoint.read_resume_point(args.resume_from_checkpoint, args.output_dir))
    reward = cfg.reward if cfg is not None else _attempt([], lambda: _reward_settings(args))
    if reward is not None:  # also when another flag is wrong: every problem is reported at once
        problems += reward_problems(reward, getattr(args, "model_family", None))
    from fastvideo.training.run import output_dir as run_dir

    overwrite = getattr(args, "overwrite", False)
    problems += run_dir.folder_problems(args.output_dir, bool(args.resume_from_checkpoint), overwrite)
    return problems


def _reward_settings(args: argparse.Namespace):
    """The reward flags' settings alone, DanceGRPO's --use_hpsv2 / --use_pickscore and MixGRPO's
    --reward_model read as --rewards first (validate_args translates them, but it stopped at another
    flag; their own mistakes are reported by validate_args)."""
    from fastvideo import compat
    from fastvideo.config import _defaults
    from fastvideo.rewards.settings import RewardSettings

    return RewardSettings.from_args(compat.translate(args, _defaults())[0])


def reward_problems(r, family: str | None = None) -> list[str]:
    """Missing reward weights of the local rewards, remote:/vlm: endpoints that do not answer, and
    a served reward that needs source images in a run of ``family`` without them (``r``: the
    RewardSettings)."""
    from types import SimpleNamespace

    problems: list[str] = []
    names = {s.name for s in r.spec if not s.url}
    if "hpsv2" in names:
        from fastvideo.rewards.hps import check_hps_architecture

        # The files, and their shapes against --hps_model_name's architecture (memory-mapped: a
        # wrong checkpoint is one line here, not a size-mismatch traceback from every rank later).
        _attempt(problems, lambda: check_hps_architecture(r.hps_ckpt_dir, r.hps_model_name))
    problems += weight_folder_problems(r, names)
    if any(s.url for s in r.spec):
        from fastvideo.training.builders import check_reward_endpoints

        model = SimpleNamespace(family=family) if family else None
        _attempt(problems, lambda: check_reward_endpoints(SimpleNamespace(reward=r, model=model)))
    return problems


def weight_folder_problems(r, names: set) -> list[str]:
    """The reward-weight folders of the local rewards ``names`` (other than hpsv2's, checked with its
    architecture) that are missing or lack their files: one line each, quoting where the weights come
    from (fastvideo/rewards/weights.py, the README's "Reward weights" table)."""
    from fastvideo.rewards.weights import where_to_get

    problems: list[str] = []
    extras = r.extras
    for name, folder, flag in (("pickscore", r.pickscore_dir, "pickscore_dir"), ("clip", r.clip_dir, "clip_dir"),
                               ("clip_edit", r.clip_dir, "clip_dir")):
        if name in names and not Path(folder).is_dir():
            problems.append(f"--{flag} {folder!r} does not exist (the {name} reward's weights): "
                            f"{where_to_get(name, folder)}")
    if "aesthetic" in names and extras is not None:
        from fastvideo.rewards.aesthetic import resolve_aesthetic_files

        _attempt(problems, lambda: resolve_aesthetic_files(extras.aesthetic_dir))
    if "imagereward" in names and extras is not None:
        from fastvideo.rewards.imagereward import resolve_image_reward_files

        _attempt(problems, lambda: resolve_image_reward_files(extras.image_reward_dir))
    if "videoalign" in names and extras is not None:
        from fastvideo.rewards.videoalign import resolve_videoalign_files

        _attempt(problems, lambda: resolve_videoalign_files(extras.videoalign_dir))
    return problems


def world_problems(nproc_per_node: int, nnodes: int, device: str) -> list[str]:
    """Processes on this node against its devices (nothing to check on the CPU). A device type
    this machine lacks (a dry run of an NPU launch on a login node) is not counted."""
    from fastvideo import devices

    if device not in devices.DEVICE_TYPES:
        return [devices.device_type_problem(device)]
    if device == devices.CPU:
        return []
    if device == devices.NPU:
        module = devices._device_module(devices.NPU) if devices.npu_available() else None
        count = int(module.device_count()) if module is not None else None
        return devices.npu_launch_problems(nproc_per_node * nnodes, nproc_per_node,
                                           os.environ.get(devices.ENV_VISIBLE_NPUS), count)
    module = devices._device_module(device)
    count = int(module.device_count()) if module is not None and module.is_available() else 0
    if nproc_per_node > count:
        return [f"{nproc_per_node} processes on this node but {count} {device} device(s) visible: lower "
                "--nproc_per_node (NPROC) or widen the visible devices"]
    return []


# Images of more pixels than this are also priced for their rollout activations and VAE decode (tracing
# the transformer and the VAE on the meta device: about a second); the tiny test runs stay below it.
PRICED_PIXELS = 256 * 256


def memory_problems(cfg, nproc_per_node: int, device: str) -> list[str]:
    """A run the memory model (perf/memory.py) says cannot fit: what every rank holds through its
    rollout whatever the transformer (trajectory, decoded images, reward weights) and, for images over
    PRICED_PIXELS, the larger of the rollout's transformer activations and the VAE decode's peak
    (perf.memory.rollout_activation_floor; each a lower bound of the peak) against one device's memory, or on the
    CPU against the host's RAM shared by the node's ranks. Nothing is said when the model's config
    cannot be read (file_problems says why)."""
    import json

    from fastvideo import devices
    from fastvideo.models.base import FamilyCostModel
    from fastvideo.models.registry import get_model_family
    import torch

    from fastvideo.perf.memory import GB, MemoryShape, held_in_every_phase, rollout_activation_floor

    m = cfg.model
    folder = Path(m.dit_model_name_or_path) if m.dit_model_name_or_path else Path(m.pretrained_model_name_or_path) / "transformer"
    try:
        config = json.loads((folder / "config.json").read_text())
        family = get_model_family(m.family)
        needs = cfg.objective_needs()  # NFT's rollout keeps x0 alone, no step latents
    except (OSError, ValueError, UserError):
        return []
    r, accelerator = cfg.rollout, device != devices.CPU
    shape = MemoryShape(height=r.height, width=r.width, text_tokens=1, sampling_steps=r.sampling_steps,
                        samples_per_rank=cfg.prompts_per_rank * r.num_generations, rollout_batch=r.rollout_batch_size,
                        micro_batch=1, world_size=1, rewards=tuple(s.name for s in cfg.reward.spec if not s.url),
                        reward_bytes=2 if accelerator else 4, keeps_latents=needs.replay,
                        keeps_log_probs=needs.log_probs,
                        compute_dtype=torch.bfloat16 if m.mixed_precision == "bf16" else torch.float32,
                        vae_bytes=2 if accelerator else 4)  # at least: --vae_precision fp32 doubles it
    total, ranks = devices.total_memory_bytes(device), 1 if accelerator else max(nproc_per_node, 1)
    if total is None or not isinstance(family, FamilyCostModel):  # a plugin family without a cost model: no verdict
        return []
    need, what = held_in_every_phase(config, shape, family, over=total // ranks), ""
    vae = _vae_config(m.pretrained_model_name_or_path) if r.height * r.width > PRICED_PIXELS else None
    if need <= total // ranks and vae is not None:
        try:
            need += rollout_activation_floor(config, vae, shape, family)
            what = ", the larger of the transformer's activations and the VAE decode's"
        except (KeyError, TypeError, ValueError):  # a config.json without the keys: file_problems' to say
            pass
    need *= ranks
    if need <= total:
        return []
    where = f"one {device} device's {total / GB:.1f} GB" if accelerator else \
        f"this host's {total / GB:.1f} GB of RAM ({ranks} rank(s) on the CPU)"
    return [f"--h {r.height} --w {r.width}: the memory model puts what the rollout holds (the trajectory and decoded "
            f"images of {shape.samples_per_rank} sample(s) per rank, the reward models{what}) at {need / GB:,.1f} GB or "
            f"more, over {where}: lower --h/--w, --num_generations or the prompts per rank "
            f"(python -m fastvideo.tools.cost_model --memory estimates the whole peak)"]


def _vae_config(model_path: str) -> dict | None:
    """The model folder's vae/config.json, None when it cannot be read."""
    import json

    try:
        return json.loads((Path(model_path) / "vae" / "config.json").read_text())
    except (OSError, ValueError):
        return None


def check_training(argv: list[str], nproc_per_node: int = 1, nnodes: int = 1, device: str | None = None,
                   check_world: bool = True) -> list[str]:
    """Every problem of a training command line (the flags after the script), one line each."""
    from fastvideo.config import validate_args

    args, problems = parse_all(argv)
    if args is None:  # a bad value: the rest is checked from the flags that do parse
        args = _lenient_args(argv)
    cfg = _attempt(problems, lambda: validate_args(args)) if args is not None else None
    if args is not None:
        problems += file_problems(args, cfg, nproc_per_node * nnodes)
    device = device or os.environ.get("FASTVIDEO_DEVICE", "cpu")
    if cfg is not None:
        problems += memory_problems(cfg, nproc_per_node, device)
        if cfg.sp_size > 1:  # --sp_size against the world, the heads and the image tokens (config.json)
            from fastvideo.training.builders import build_family, check_sequence_parallel

            _attempt(problems, lambda: check_sequence_parallel(cfg, build_family(cfg), nproc_per_node * nnodes))
    if check_world:
        problems += world_problems(nproc_per_node, nnodes, device)
    return list(dict.fromkeys(problems))


def _lenient_args(argv: list[str]) -> argparse.Namespace | None:
    """The flags that do parse once the bad ones are dropped (for the file checks)."""
    from fastvideo.config import build_parser

    return flag_check.lenient_args(argv, build_parser)


def check_preprocess(argv: list[str]) -> list[str]:
    """The problems of a preprocessing command line (the flags after preprocess_embeddings.py), found
    once before torchrun starts its ranks: the flags, the prompt file, the model folder."""
    from fastvideo.data_preprocess.preprocess_embeddings import parse_args

    problems: list[str] = []
    try:
        cfg = parse_args(argv)
    except SystemExit:  # one_line_errors has printed the flag's problem
        return ["the preprocessing flags above do not parse"]
    except (UserError, OSError, ValueError) as exc:
        return [one_line(exc)]
    if not Path(cfg.model_path).is_dir():
        problems.append(f"--model_path {cfg.model_path!r} (MODEL_PATH) does not exist: put the {cfg.model_family} "
                        "model's diffusers folder there (README \"Real weights\")")
    _attempt(problems, cfg.validate)
    return problems


def script_flags(script: str, args: list[str]) -> list[str] | None:
    """The flags to check for ``script`` (with what the script implies, e.g. --use_lora), or None
    when the script is not a training entry point."""
    implied = TRAINING_SCRIPTS.get(os.path.basename(script))
    if implied is None:
        return None
    return [*(f for f in implied if f not in args), *args]


def report(problems: list[str], prog: str, nranks: int, stream=None) -> None:
    stream = stream or sys.stderr
    for problem in problems:
        stream.write(f"{prog}: error: {problem}\n")
    many = f"{len(problems)} problems" if len(problems) > 1 else "1 problem"
    stream.write(f"{prog}: {many} found before starting {nranks} rank(s); no worker was started "
                 "(FASTVIDEO_PREFLIGHT=0 skips this check)\n")
    stream.flush()


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(allow_abbrev=False, prog="python -m fastvideo.preflight",
                                description=__doc__.splitlines()[0])
    p.add_argument("--nproc_per_node", type=int, default=1)
    p.add_argument("--nnodes", type=int, default=1)
    p.add_argument("script")
    p.add_argument("flags", nargs=argparse.REMAINDER)
    a = p.parse_args(argv)
    flags = script_flags(a.script, a.flags)
    if flags is None:
        print(f"{a.script}: not a training entry point; nothing to check")
        return 0
    problems = check_training(flags, a.nproc_per_node, a.nnodes)
    if problems:
        report(problems, "train_grpo_flux", a.nproc_per_node * a.nnodes)
        return 2
    print("train_grpo_flux: configuration check passed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
