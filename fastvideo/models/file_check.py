"""Damaged model folders, found before a model loads: one line per problem instead of diffusers'
tracebacks (which read "Unable to load weights" for a cut file and a TypeError deep in a
constructor for a wrong-typed config value).

Checked per component (``transformer``, ``vae``, text encoders):

- ``config.json`` parses, as a JSON object;
- every ``*.safetensors`` file: its header (8-byte length, then JSON) parses, each tensor's byte
  range fits its dtype and shape, and the file is as long as the header says (a cut download);
- for the transformer and the VAE, the model ``config.json`` describes is built on the meta
  device (no memory) and its parameters' names and shapes are compared with the weights' headers:
  a config value of the wrong type, or a config from another model, is named here.

Only headers are read (the weights' bytes are not), so a folder of any size is checked in seconds.
"""

from __future__ import annotations

import json
import struct
from pathlib import Path
from typing import Mapping

DTYPE_BYTES = {"F64": 8, "F32": 4, "F16": 2, "BF16": 2, "I64": 8, "I32": 4, "I16": 2, "I8": 1, "U8": 1, "BOOL": 1,
               "U16": 2, "U32": 4, "U64": 8, "F8_E4M3": 1, "F8_E5M2": 1}
MAX_HEADER_BYTES = 100 << 20  # safetensors' own limit
SHAPE_CHECKED = ("transformer", "vae")
FIX = "re-download the model, or copy the folder again from one complete download"


def read_config(path: Path) -> tuple[dict | None, str | None]:
    """(config.json's object, None) or (None, the problem)."""
    try:
        value = json.loads(path.read_text(encoding="utf-8"))
    except UnicodeDecodeError:
        return None, f"{path} is not a text file; {FIX}"
    except ValueError as exc:
        return None, f"{path} is not valid JSON ({exc}); {FIX}"
    except OSError as exc:
        return None, f"{path} cannot be read ({exc.strerror or exc})"
    if not isinstance(value, dict):
        return None, f"{path} holds a JSON {type(value).__name__}, not an object; {FIX}"
    return value, None


def safetensors_shapes(path: Path) -> tuple[dict[str, list[int]], str | None]:
    """({tensor name: shape}, None) from a safetensors file's header, or ({}, the problem): an
    unreadable header, a tensor whose byte range does not fit its dtype and shape, a cut file."""
    size = path.stat().st_size
    with open(path, "rb") as f:
        head = f.read(8)
        n = struct.unpack("<Q", head)[0] if len(head) == 8 else -1
        if 0 < n <= MAX_HEADER_BYTES and n > size - 8:
            return {}, f"{path} is {size} bytes, shorter than its own {n}-byte header (cut short); {FIX}"
        if not 0 < n <= MAX_HEADER_BYTES:
            return {}, f"{path} is not a safetensors file (header length {n} for {size} bytes); {FIX}"
        raw = f.read(n)
    try:
        header = json.loads(raw.decode("utf-8"))
        if not isinstance(header, dict):
            raise ValueError(f"a JSON {type(header).__name__}")
    except (ValueError, RecursionError) as exc:  # UnicodeDecodeError is a ValueError
        return {}, f"{path}: its safetensors header is damaged ({str(exc)[:80]}); {FIX}"
    shapes, end = {}, 0
    for name, meta in header.items():
        if name == "__metadata__":
            continue
        problem = _tensor_problem(name, meta)
        if problem:
            return {}, f"{path}: its safetensors header is damaged ({problem}); {FIX}"
        shapes[name], end = meta["shape"], max(end, meta["data_offsets"][1])
    if size != 8 + n + end:
        return {}, (f"{path} is {size} bytes but its header describes {8 + n + end} (cut short: an interrupted "
                    f"download or copy); {FIX}" if size < 8 + n + end else
                    f"{path} is {size} bytes, {size - 8 - n - end} more than its header describes; {FIX}")
    return shapes, None


def _tensor_problem(name: str, meta) -> str | None:
    """What is wrong with one header record (None: nothing)."""
    if not isinstance(meta, dict) or meta.get("dtype") not in DTYPE_BYTES:
        return f"tensor {name!r} has no known dtype"
    shape, offsets = meta.get("shape"), meta.get("data_offsets")
    if not (isinstance(shape, list) and all(type(d) is int and d >= 0 for d in shape)):
        return f"tensor {name!r} has shape {shape!r:.40}"
    if not (isinstance(offsets, list) and len(offsets) == 2 and all(type(o) is int for o in offsets)
            and 0 <= offsets[0] <= offsets[1]):
        return f"tensor {name!r} has byte range {offsets!r:.40}"
    count = 1
    for d in shape:
        count *= d
    if offsets[1] - offsets[0] != count * DTYPE_BYTES[meta["dtype"]]:
        return f"tensor {name!r} of shape {shape} takes {offsets[1] - offsets[0]} bytes"
    return None


def _meta_model(component: str, config: dict, family):
    """The component ``config`` describes, on the meta device (no memory)."""
    import torch

    if component == "transformer":
        return family.meta_transformer(config, torch.float32)
    from diffusers import AutoencoderKL

    with torch.device("meta"):
        return AutoencoderKL.from_config({k: v for k, v in config.items() if not k.startswith("_")})


def shape_problem(folder: Path, component: str, config: dict, weights: Mapping[str, list[int]], family) -> str | None:
    """Whether the model ``config`` builds has the weights' parameters (names and shapes)."""
    if component == "vae" and config.get("_class_name", "AutoencoderKL") != "AutoencoderKL":
        return None  # another VAE class: left to its loader
    try:
        model = _meta_model(component, config, family)
    except ImportError:  # the environment's, not the config's
        raise
    except Exception as exc:  # noqa: BLE001 - any constructor failure is the config's: a wrong-typed value
        return (f"{folder / 'config.json'} does not build a {component}: {type(exc).__name__}: "
                f"{str(exc).splitlines()[0][:160] if str(exc) else ''} (a value of the wrong type?); {FIX}")
    expected = {k: list(v.shape) for k, v in model.state_dict().items()}
    params = {k for k, _ in model.named_parameters()}  # a buffer may be left out of the file: rebuilt
    missing = [k for k in expected if k not in weights and k in params]
    wrong = [k for k in expected if k in weights and list(weights[k]) != expected[k]]
    if not missing and not wrong:
        return None
    first = (f"{wrong[0]} is {expected[wrong[0]]} by config.json, {list(weights[wrong[0]])} in the weights" if wrong
             else f"{missing[0]} is not in the weights")
    more = len(missing) + len(wrong) - 1
    return (f"{folder}: its config.json and weights disagree ({first}{f'; {more} more' if more else ''}): the folder "
            f"mixes two models; copy config.json and the weights from one download")


def component_problems(folder: Path, component: str, family) -> list[str]:
    """Every problem of one component folder (see the module doc)."""
    config, problem = read_config(folder / "config.json")
    problems = [problem] if problem else []
    weights: dict[str, list[int]] = {}
    for path in sorted(folder.glob("*.safetensors")):
        shapes, problem = safetensors_shapes(path)
        if problem:
            problems.append(problem)
        weights.update(shapes)
    if not problems and config is not None and weights and component in SHAPE_CHECKED:
        problem = shape_problem(folder, component, config, weights, family)
        problems += [problem] if problem else []
    return problems


def training_folders(family, model_path: str, dit_path: str | None, vae_path: str | None) -> dict[str, Path]:
    """{component: folder} the trainer loads from (as training.builders resolves the flags):
    the transformer (--dit_model_name_or_path: a model folder or a transformer folder), the VAE
    (--vae_model_path's vae/), and the family's text encoders."""
    root = Path(model_path)
    folders = {comp: root / comp for comp in family.training_components if comp.startswith("text_encoder")}
    dit = Path(dit_path) if dit_path else None
    folders["transformer"] = (root / "transformer" if dit is None else
                              dit / "transformer" if (dit / "transformer" / "config.json").is_file() else dit)
    folders["vae"] = Path(vae_path or model_path) / "vae"
    return folders


def model_file_problems(family, folders: Mapping[str, Path]) -> list[str]:
    """Problems of the component folders (those present: a missing one is check_folder's)."""
    problems = []
    for component, folder in folders.items():
        if folder.is_dir():
            problems += component_problems(folder, component, family)
    return problems


def check_model_files(model_cfg, family) -> None:
    """Raise InputFileError naming every problem of the folders a run loads (ModelConfig's paths)."""
    from fastvideo.errors import InputFileError

    problems = model_file_problems(family, training_folders(family, model_cfg.pretrained_model_name_or_path,
                                                            model_cfg.dit_model_name_or_path, model_cfg.vae_model_path))
    if problems:
        raise InputFileError("; ".join(problems))
