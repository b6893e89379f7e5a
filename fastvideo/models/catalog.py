"""Each built-in family's wiring outside its folder, one line a family: its tiny builder, the CPU
demo's settings (scripts/demo/grpo_tiny_cpu.sh MODEL=NAME) and the preprocessing launcher's
defaults (scripts/preprocess/preprocess_NAME_rl_embeddings.sh). The shell scripts read it through

    python -m fastvideo.models.catalog demo NAME --demo_dir DIR     (shell assignments, for eval)
    python -m fastvideo.models.catalog preprocess NAME              (shell assignments, for eval)

Standard library only (the demo asks before any environment is installed), and it imports no
family: the registry (fastvideo/models/registry.py) maps the same names to the family classes,
and tests/tools/test_catalog.py holds the two lists equal. The folder names follow from the name:
DEMO_DIR/tiny_NAME, DEMO_DIR/embeddings_NAME, DEMO_DIR/outputs_NAME, data/NAME,
data/rl_embeddings_NAME (FLUX, the default family, without the _NAME).
"""

from __future__ import annotations

import argparse
import hashlib
import os
import shlex
import sys
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
DEFAULT = "flux"  # the demo's MODEL default (and the registry's DEFAULT_FAMILY)
EDIT_PROMPTS = "assets/edit/prompts_edit.jsonl"


@dataclass(frozen=True)
class Env:
    """A demo argument read from the environment variable ``name`` (``default`` when unset or empty)."""

    name: str
    default: str


@dataclass(frozen=True)
class InDemoDir:
    """A demo argument naming a path under the demo's DEMO_DIR."""

    rel: str


@dataclass(frozen=True)
class Wiring:
    """One family's line. ``demo_args``: the demo's family flags (strings, Env or InDemoDir);
    ``demo_seq``: the demo's MAX_SEQ_LEN (the bundled prompts' longest, in the family's tokens);
    ``current_line``: the family runs on the current library line only (LINE=current forced);
    ``prompts``: the demo's prompt file (None: assets/prompts.txt); ``demo_env``: variables the demo
    exports unless set (read by the preprocessing launcher); ``seq``: the preprocessing launcher's
    MAX_SEQ_LEN (None: preprocess_flux_rl_embeddings.sh's 512); ``preprocess_args``: its extra flags;
    ``model``: the model folder's name under data/ when the family shares another's checkpoint."""

    name: str
    builder: tuple[str, ...]
    demo_seq: int
    demo_args: tuple = ()
    current_line: bool = True
    prompts: str | None = None
    demo_env: tuple[tuple[str, str], ...] = ()
    seq: int | None = 512
    preprocess_args: tuple = ()
    model: str | None = None  # the preprocessing launcher's data/MODEL (None: data/NAME)

    @property
    def suffix(self) -> str:
        return "" if self.name == DEFAULT else f"_{self.name}"


# The editing demos' reward and evaluation: clip_edit (tiny CLIP weights built into DEMO_DIR/tiny_rewards)
# keeps the source and follows the instruction; the held-out instructions of assets/edit/eval_edit.jsonl.
EDIT_DEMO = ("--rewards", "clip_edit:1.0", "--clip_dir", InDemoDir("tiny_rewards/pickscore"),
             "--eval_prompts", "assets/edit/eval_edit.jsonl", "--eval_rewards", "clip_edit,detail")
FLOW_SDE = ("--flow_grpo_sampling", "--no_quantize_timestep")  # Flow-GRPO's SDE, continuous timesteps

FAMILIES = (
    Wiring("flux", ("fastvideo.tools.make_tiny_flux", "--preset", "tiny"), 32, current_line=False, seq=None),
    # SD3.5: classifier-free guidance 4.5; preprocessing at Flow-GRPO's train_sd3.py max_sequence_length=128
    Wiring("sd3", ("fastvideo.tools.make_tiny_sd3",), 16, ("--guidance_scale", "4.5", *FLOW_SDE),
           current_line=False, seq=128),
    # klein: the bundled prompts' longest is 76 tokens; lr 1e-2: at the shared 3e-3 the tiny klein's
    # reward did not rise in 40 iterations (docs/flux2.md, Demo)
    Wiring("flux2", ("fastvideo.tools.make_tiny_flux2",), 80,
           ("--guidance_scale", "4.0", *FLOW_SDE, "--pipeline_shift", "--learning_rate", "1e-2")),
    # as flux2's tokenizer and chat template; the 8-GPU launcher's guidance 4.0 (Flow-Factory's), the
    # scheduler's shift 3; lr: docs/zimage.md, Demo
    Wiring("zimage", ("fastvideo.tools.make_tiny_zimage",), 80,
           ("--guidance_scale", "4.0", *FLOW_SDE, "--shift", "3", "--learning_rate", Env("ZIMAGE_LR", "1e-2"))),
    # the bundled prompts' longest with the template's suffix, after its 34-token prefix; the 8-GPU
    # launcher's true CFG 4.0 (Flow-Factory's) and the pipeline's shift; lr as Z-Image's demo
    Wiring("qwen_image", ("fastvideo.tools.make_tiny_qwen_image",), 96,
           ("--guidance_scale", "4.0", *FLOW_SDE, "--pipeline_shift", "--learning_rate",
            Env("QWEN_IMAGE_LR", "1e-2"))),
    # FluxKontextPipeline's guidance 2.5 and shift
    Wiring("kontext", ("fastvideo.tools.make_tiny_kontext",), 32,
           ("--guidance_scale", "2.5", "--no_quantize_timestep", "--pipeline_shift", *EDIT_DEMO),
           prompts=EDIT_PROMPTS, seq=None),
    # the instruction with its 384^2 condition image's Qwen2.5-VL tokens; sources at a 64^2 VAE area in
    # the demo (16 source tokens beside the 16 generated), Flow-Factory's 384^2 (576 tokens) by default
    Wiring("qwen_image_edit", ("fastvideo.tools.make_tiny_qwen_image_edit",), 320,
           ("--guidance_scale", "4.0", *FLOW_SDE, "--pipeline_shift", "--learning_rate",
            Env("QWEN_IMAGE_LR", "1e-2"), *EDIT_DEMO),
           prompts=EDIT_PROMPTS, demo_env=(("SOURCE_VAE_SIZE", "64"),),
           preprocess_args=("--source_vae_size", Env("SOURCE_VAE_SIZE", "384"))),
    # klein editing: klein's folder and demo settings (lr 1e-2, the pipeline's schedule), the editing
    # demos' reward and held-out instructions
    Wiring("flux2_edit", ("fastvideo.tools.make_tiny_flux2",), 80,
           ("--guidance_scale", "4.0", *FLOW_SDE, "--pipeline_shift", "--learning_rate", "1e-2", *EDIT_DEMO),
           prompts=EDIT_PROMPTS, model="flux2"),
    # 5-frame clips (2 latent frames), compressibility averaged over every frame; WanPipeline's guidance
    # 5.0 with its negative prompt "" and the Wan2.1 folder's flow_shift 3; the tiny T5-style tokenizer
    # spells letters, cut at 32 as FLUX.1's. Sample clips (MP4) and the evaluation (its grid as frame
    # strips, the guard's best/) as every demo's
    Wiring("wan", ("fastvideo.tools.make_tiny_wan",), 32,
           ("--num_frames", "5", "--guidance_scale", Env("WAN_GUIDANCE", "5.0"), *FLOW_SDE, "--learning_rate",
            Env("WAN_LR", "1e-2"))),
    # both library lines; 5-frame clips, the pipeline's embedded guidance 6.0 (one pass), DanceGRPO's
    # HunyuanVideo shift 5; the bundled prompts' longest is 52 of the tiny Llama tokenizer's tokens after
    # the template's 95; preprocessing at the pipeline's max_sequence_length 256
    Wiring("hunyuan_video", ("fastvideo.tools.make_tiny_hunyuan_video",), 52,
           ("--num_frames", "5", "--guidance_scale", "6.0", *FLOW_SDE, "--shift", "5", "--learning_rate",
            Env("HUNYUAN_VIDEO_LR", "1e-2")), current_line=False, seq=256),
    # image-to-video: Wan's demo on the editing prompt file (64x64 sources: the clips' first frames and
    # size), its reward and held-out instructions; the text at 512 tokens (the I2V transformer's); each
    # first frame encoded for --num_frames (NUM_FRAMES: the demo's 5, the launcher's default 81)
    Wiring("wan_i2v", ("fastvideo.tools.make_tiny_wan", "--variant", "i2v"), 512,
           ("--num_frames", Env("NUM_FRAMES", "5"), "--guidance_scale", Env("WAN_GUIDANCE", "5.0"), *FLOW_SDE,
            "--learning_rate", Env("WAN_LR", "1e-2"), *EDIT_DEMO),
           prompts=EDIT_PROMPTS, demo_env=(("NUM_FRAMES", "5"),),
           preprocess_args=("--num_frames", Env("NUM_FRAMES", "81"))),
)
BY_NAME = {w.name: w for w in FAMILIES}


def names() -> list[str]:
    return [w.name for w in FAMILIES]


def wiring(name: str) -> Wiring:
    """The family's line; KeyError naming the known ones."""
    if name not in BY_NAME:
        raise KeyError(f"use {', '.join(names()[:-1])} or {names()[-1]}")
    return BY_NAME[name]


def resolve(arg, demo_dir: str = "", environ=os.environ) -> str:
    """An argument's text: an Env from ``environ``, an InDemoDir under ``demo_dir``, a string as is."""
    if isinstance(arg, Env):
        return environ.get(arg.name) or arg.default
    if isinstance(arg, InDemoDir):
        return f"{demo_dir}/{arg.rel}"
    return arg


def builder_stamp(root: Path = ROOT) -> str:
    """A hash of every tiny builder module (fastvideo/tools/*tiny*.py): the demo rebuilds a tiny folder
    built by another version of them (else it would silently train the old model)."""
    digest = hashlib.sha256()
    for path in sorted((root / "fastvideo" / "tools").glob("*tiny*.py")):
        digest.update(path.read_bytes())
    return digest.hexdigest()[:16]


def _array(name: str, words) -> str:
    return f"{name}=({' '.join(shlex.quote(w) for w in words)})"


def demo_lines(w: Wiring, demo_dir: str, environ=os.environ) -> list[str]:
    """The demo's shell assignments for family ``w`` (scripts/demo/grpo_tiny_cpu.sh evals them)."""
    family = () if w.name == DEFAULT else ("--model_family", w.name)
    lines = [f"TINY=tiny_{w.name}", _array("BUILD", w.builder), f"EMB=embeddings{w.suffix}",
             f"OUT=outputs{w.suffix}", f"PREPROCESS=preprocess_{w.name}_rl_embeddings.sh", f"SEQ={w.demo_seq}",
             _array("FAMILY_ARGS", [*family, *(resolve(a, demo_dir, environ) for a in w.demo_args)]),
             f"DEMO_LINE={'current' if w.current_line else 'any'}", f"STAMP={builder_stamp()}"]
    if w.prompts:
        lines.append(f"PROMPTS={shlex.quote(w.prompts)}")
    lines += [f"export {k}={shlex.quote(environ.get(k) or v)}" for k, v in w.demo_env]
    return lines


def preprocess_lines(w: Wiring, environ=os.environ) -> list[str]:
    """The preprocessing launcher's defaults for family ``w``: data/NAME into data/rl_embeddings_NAME,
    exported unless set, and its flags (FAMILY_FLAGS)."""
    defaults = {"MODEL_PATH": f"data/{w.model or w.name}", "OUTPUT_DIR": f"data/rl_embeddings{w.suffix}"}
    defaults |= {"LINE": "current"} if w.current_line else {}
    defaults |= {"PROMPT_FILE": w.prompts} if w.prompts else {}
    defaults |= {"MAX_SEQ_LEN": str(w.seq)} if w.seq else {}
    flags = ("--model_family", w.name, *(resolve(a, environ=environ) for a in w.preprocess_args))
    return [f"export {k}={shlex.quote(environ.get(k) or v)}" for k, v in defaults.items()] + [_array("FAMILY_FLAGS", flags)]


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(prog="python -m fastvideo.models.catalog", description=__doc__.splitlines()[0])
    ap.add_argument("what", choices=("demo", "preprocess", "names"))
    ap.add_argument("name", nargs="?", default=DEFAULT)
    ap.add_argument("--demo_dir", default="data/demo")
    args = ap.parse_args(argv)
    if args.what == "names":
        print(" ".join(names()))
        return
    try:
        w = wiring(args.name)
    except KeyError as exc:  # one line naming the choices, exit 2 (a user's mistake)
        print(f"{'MODEL' if args.what == 'demo' else 'family'}={args.name}: {exc.args[0]}", file=sys.stderr)
        sys.exit(2)
    print("\n".join(demo_lines(w, args.demo_dir) if args.what == "demo" else preprocess_lines(w)))


if __name__ == "__main__":
    main()
