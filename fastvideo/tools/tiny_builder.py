"""What every ``make_tiny_*`` builder shares: the diffusers folder layout, the seeding conventions
and the command line. A builder module holds only its family's configs and networks.

A tiny folder is what ``<Pipeline>.from_pretrained(folder)`` loads offline:

    model_index.json                    the pipeline class, each component's library and class
    scheduler/scheduler_config.json     the family's flow-matching scheduler
    tokenizer*/, processor/             written by the builder (tokenizers built here, no hub)
    transformer/, vae/, text_encoder*/  each network's save_pretrained (safetensors)

Seeding (what makes "the same seed gives the same weights, bit for bit" hold): the builder calls
``torch.manual_seed(seed)`` once, creates its networks in a fixed order, then
``wake_zero_projections(transformer, seed + 1)``.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Callable

import torch

from fastvideo.utils import atomic_write_json

# CLIP's BPE special tokens (its vocabulary's last two ids: BOS, EOS).
START_TOKEN, END_TOKEN = "<|startoftext|>", "<|endoftext|>"
# Weight-name prefixes of published checkpoints that transformers 5 leaves out when it saves: its
# CLIPTextModel has no text_model sub-module, while FLUX.1-dev's text_encoder (openai's CLIP layout)
# names every weight text_model.*. transformers 5 reads both forms; 4.x reads only the prefixed
# one and would initialise a prefix-less encoder at random (with a warning).
HUB_PREFIXES = {"CLIPTextModel": "text_model."}


def bytes_to_unicode() -> dict[int, str]:
    """CLIP's reversible byte -> printable-character map (GPT-2 byte-level BPE)."""
    printable = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1))
    printable += list(range(ord("®"), ord("ÿ") + 1))
    chars = printable[:]
    n = 0
    for b in range(256):
        if b not in printable:
            printable.append(b)
            chars.append(256 + n)
            n += 1
    return dict(zip(printable, (chr(c) for c in chars)))


def write_clip_vocab(folder: Path) -> int:
    """A byte-level CLIP BPE vocabulary without merges (every word splits into byte symbols, each
    also with its '</w>' end-of-word form; BOS and EOS last): vocab.json and merges.txt in
    ``folder``. Returns the vocabulary's size."""
    symbols = list(bytes_to_unicode().values())
    tokens = symbols + [s + "</w>" for s in symbols] + [START_TOKEN, END_TOKEN]
    (folder / "vocab.json").write_text(json.dumps({t: i for i, t in enumerate(tokens)}, ensure_ascii=False))
    (folder / "merges.txt").write_text("#version: 0.2\n", encoding="utf-8")
    return len(tokens)


def wake_zero_projections(transformer, seed: int) -> None:
    """Random init leaves the transformer's output projections at zero (adaLN-zero style); give
    them small values (from ``seed``) so the tiny model's velocity depends on its input and the
    RL has a signal."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, param in transformer.named_parameters():
            if torch.count_nonzero(param) == 0 and param.ndim >= 1 and "norm" not in name:
                param.copy_(torch.randn(param.shape, generator=g) * 0.02)


def use_hub_names(folder: Path, module) -> None:
    """Rename the weights ``module.save_pretrained(folder)`` wrote to the published layout, so that
    the folder loads on both library lines (on transformers 4.x they already are: nothing changes)."""
    from safetensors import safe_open
    from safetensors.torch import load_file, save_file

    prefix = HUB_PREFIXES.get(type(module).__name__)
    for path in sorted(folder.glob("*.safetensors")) if prefix else ():
        tensors = load_file(path)
        if all(k.startswith(prefix) for k in tensors):
            continue
        with safe_open(path, "pt") as f:
            metadata = f.metadata()
        save_file({k if k.startswith(prefix) else prefix + k: v for k, v in tensors.items()}, path, metadata=metadata)


def model_index(pipeline: str, modules: dict, scheduler_config: dict, named: dict[str, str], **extra) -> dict:
    """model_index.json of a folder: ``pipeline`` (its _class_name) at the scheduler config's
    diffusers version; each network of ``modules`` (sub-folder -> network) under its own library and
    class, the scheduler's class, ``named`` (sub-folder -> transformers class: tokenizers and
    processors, whose saved class need not be the one the index names) and ``extra`` entries
    (is_distilled), in the published files' order: the two header keys, then the rest sorted."""
    entries = {name: [type(m).__module__.split(".")[0], type(m).__name__] for name, m in modules.items()}
    entries |= {name: ["transformers", cls] for name, cls in named.items()}
    entries |= {"scheduler": ["diffusers", scheduler_config["_class_name"]], **extra}
    header = {"_class_name": pipeline, "_diffusers_version": scheduler_config["_diffusers_version"]}
    return {**header, **dict(sorted(entries.items()))}


def save_tiny_folder(out: Path, modules: dict, scheduler_config: dict, pipeline: str, named: dict[str, str],
                     **extra) -> Path:
    """Write each module (sub-folder name -> network) as safetensors, the scheduler config and
    model_index.json (model_index's, of these arguments): a folder the family's diffusers pipeline
    ``pipeline`` loads, on both library lines."""
    for name, module in modules.items():
        module.save_pretrained(out / name, safe_serialization=True)
        use_hub_names(out / name, module)
    atomic_write_json(out / "scheduler" / "scheduler_config.json", scheduler_config)
    atomic_write_json(out / "model_index.json", model_index(pipeline, modules, scheduler_config, named, **extra))
    return out


def new_folder(out_dir: str | Path, current_line_for: str | None = None) -> Path:
    """The folder to write, created. ``current_line_for`` (e.g. "the tiny Z-Image builder"): the
    builder needs the current library line, refused here (UserError naming the line to install)
    before anything is written."""
    if current_line_for:
        from fastvideo.library_lines import CURRENT, require_line

        require_line(CURRENT, current_line_for)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    return out


def folder_megabytes(out: Path) -> float:
    return sum(f.stat().st_size for f in out.rglob("*") if f.is_file()) / 1e6


def run_builder_cli(tool: str, doc: str, build: Callable[[argparse.Namespace], Path],
                    what: Callable[[argparse.Namespace], str], argv: list[str] | None = None,
                    options: tuple[tuple[tuple[str, ...], dict], ...] = (),
                    note: Callable[[argparse.Namespace], str] = lambda args: "") -> None:
    """``python -m fastvideo.tools.<tool> OUT_DIR [--seed N] [options]``: parse, ``build(args)``
    (-> the folder), print ``wrote <what(args)> folder to OUT (.. MB, seed N<note(args)>)``. A
    UserError (the other library line, a bad option value): one line naming the fix, exit 2, nothing
    written. ``options``: the builder's own (flags, add_argument keywords) pairs."""
    from fastvideo.errors import UserError, exit_on_user_error

    ap = argparse.ArgumentParser(allow_abbrev=False, description=doc.splitlines()[0])
    ap.add_argument("out_dir", help="folder to write (created if missing)")
    ap.add_argument("--seed", type=int, default=0, help="the same seed writes the same weights (default: 0)")
    for flags, keywords in options:
        ap.add_argument(*flags, **keywords)
    args = ap.parse_args(argv)
    try:
        out = build(args)
    except UserError as exc:  # e.g. the recipe line: one line naming the line to install, exit 2
        exit_on_user_error(tool, exc)
    print(f"wrote {what(args)} folder to {out} ({folder_megabytes(out):.2f} MB, seed {args.seed}{note(args)})")
