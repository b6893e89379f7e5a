"""The model-family registry: ``--model_family NAME`` or a plugin ``--model_family pkg.module:Name``.

The built-in families (flux, sd3, flux2, zimage, qwen_image, kontext,
qwen_image_edit, flux2_edit, wan, hunyuan_video, wan_i2v) are registered here, imported when first asked for; a family
module never imports this one, so the registry and its implementations form no import circle.
A plugin module is imported first (it may call ``register_model_family`` on import) and ``Name``
is a registered name or a ModelFamily factory in it. A name is registered once: registering
another factory under a taken name is refused (the same factory again is a no-op).
"""

from __future__ import annotations

import importlib
from typing import Callable

from fastvideo.errors import ConfigError, UserError
from fastvideo.models.base import ModelFamily

# The --model_family flags' default.
DEFAULT_FAMILY = "flux"
# The family of runs whose OUTPUT_DIR/config.json predates its model.family key (they trained FLUX).
UNRECORDED_RUN_FAMILY = "flux"

FamilyFactory = Callable[..., ModelFamily]
_REGISTRY: dict[str, FamilyFactory] = {}


class UnknownModelFamilyError(UserError, ValueError):
    """--model_family names no registered family and no importable plugin."""


def register_model_family(name: str, factory: FamilyFactory) -> None:
    """Make ``get_model_family(name, **settings)`` call ``factory(**settings)``. ValueError when
    ``name`` is taken by another factory."""
    _builtin()
    taken = _REGISTRY.get(name)
    if taken is not None and taken is not factory:
        raise ValueError(f"model family {name!r} is already registered (as {_label(taken)}); "
                         f"pick another name for {_label(factory)}")
    _REGISTRY[name] = factory


def _label(factory) -> str:
    return f"{getattr(factory, '__module__', '?')}.{getattr(factory, '__qualname__', repr(factory))}"


def builtin_families() -> dict[str, FamilyFactory]:
    """The built-in families by name, in fastvideo/models/catalog.py's order (its line for each holds
    the family's wiring outside its folder: tiny builder, demo, preprocessing launcher; a test holds
    the two lists equal). Imported here by name, as written: a family module never imports this one."""
    from fastvideo.models.flux.family import FluxFamily
    from fastvideo.models.flux2.family import Flux2Family
    from fastvideo.models.flux2_edit.family import Flux2EditFamily
    from fastvideo.models.hunyuan_video.family import HunyuanVideoFamily
    from fastvideo.models.kontext.family import KontextFamily
    from fastvideo.models.qwen_image.family import QwenImageFamily
    from fastvideo.models.qwen_image_edit.family import QwenImageEditFamily
    from fastvideo.models.sd3.family import SD3Family
    from fastvideo.models.wan.family import WanFamily
    from fastvideo.models.wan_i2v.family import WanI2VFamily
    from fastvideo.models.zimage.family import ZImageFamily

    return {
        "flux": FluxFamily,
        "sd3": SD3Family,
        "flux2": Flux2Family,  # the current library line only (its library_line)
        "zimage": ZImageFamily,  # the current library line only
        "qwen_image": QwenImageFamily,  # the current library line only
        "kontext": KontextFamily,  # FLUX.1 Kontext: FLUX.1's transformer, a source image
        "qwen_image_edit": QwenImageEditFamily,  # Qwen-Image's transformer, a source image
        "flux2_edit": Flux2EditFamily,  # FLUX.2 [klein] editing: klein's folder, a source image
        "wan": WanFamily,  # Wan2.1-T2V / Wan2.2-TI2V-5B video; the current library line only
        "hunyuan_video": HunyuanVideoFamily,  # HunyuanVideo (DanceGRPO's video model); both library lines
        "wan_i2v": WanI2VFamily,  # Wan2.1-I2V: Wan's transformer, a first frame per prompt; the current line only
    }


def _builtin() -> None:
    if "flux" in _REGISTRY:
        return
    for name, factory in builtin_families().items():
        _REGISTRY.setdefault(name, factory)


def model_family_names() -> list[str]:
    _builtin()
    return sorted(_REGISTRY)


def _plugin(name_or_path: str) -> FamilyFactory:
    module_name, _, attr = name_or_path.partition(":")
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise UnknownModelFamilyError(
            f"model family plugin {name_or_path!r}: cannot import {module_name!r} ({exc}); "
            f"built-in families: {', '.join(model_family_names())}"
        ) from None
    factory = _REGISTRY.get(attr) or getattr(module, attr, None)
    if factory is None:
        raise UnknownModelFamilyError(f"model family plugin {name_or_path!r}: {module_name} has no {attr!r}")
    _check_factory(factory, name_or_path)
    return factory


def _check_factory(factory, name_or_path: str) -> None:
    """A plugin's ``Name`` must be a ModelFamily subclass or a function that builds one (checked
    when built): a module, a constant or another class is refused here, in one line, instead of a
    TypeError at its first use."""
    fix = "name a ModelFamily subclass (fastvideo.models.base.ModelFamily) or a function returning one"
    if isinstance(factory, type):
        if not issubclass(factory, ModelFamily):
            raise UnknownModelFamilyError(
                f"model family plugin {name_or_path!r}: {factory.__qualname__} is a class but not a ModelFamily; {fix}")
    elif not callable(factory):
        raise UnknownModelFamilyError(
            f"model family plugin {name_or_path!r}: it is a {type(factory).__name__}, not a family; {fix}")


def family_factory(name_or_path: str) -> FamilyFactory:
    """The factory of a registered family or of a "pkg.module:Name" plugin (imported first); a
    family of the other library line is refused here, before anything is built."""
    _builtin()
    if ":" in name_or_path:
        factory = _plugin(name_or_path)
    elif name_or_path not in _REGISTRY:
        raise UnknownModelFamilyError(
            f"unknown model family {name_or_path!r}; valid: {', '.join(model_family_names())} "
            "(or a plugin as pkg.module:Name)"
        )
    else:
        factory = _REGISTRY[name_or_path]
    _require_line(factory, name_or_path)
    return factory


def _require_line(factory, name: str) -> None:
    """Refuse a family whose class names a library line other than this environment's (its module
    imports nothing of that line's libraries until it is built)."""
    line = getattr(factory, "library_line", None)
    if line is not None:
        from fastvideo.library_lines import require_line

        require_line(line, f"model family {name!r}")


def get_model_family(name_or_path: str, **settings) -> ModelFamily:
    """A registered family by name, or "pkg.module:Name", built with ``settings``; a plugin function
    that returns something other than a ModelFamily is refused in one line."""
    family = family_factory(name_or_path)(**settings)
    if not isinstance(family, ModelFamily):
        raise UnknownModelFamilyError(
            f"model family {name_or_path!r} built a {type(family).__name__}, not a ModelFamily: name a "
            "ModelFamily subclass (fastvideo.models.base.ModelFamily) or a function returning one")
    return family


def family_for_class_name(class_name: str) -> str | None:
    """The registered family whose transformer class an exported config names (config.json's
    _class_name, e.g. a checkpoint's config.json); None when no family, or more than
    one, claims it (the class name alone cannot tell those apart)."""
    _builtin()
    claimants = []
    for name, factory in sorted(_REGISTRY.items()):
        if getattr(factory, "variant_of", None):  # shares another family's transformer class (Kontext: FLUX.1's)
            continue
        # A family class says it without being built; other factories are built with no settings.
        claimed = getattr(factory, "export_class_name", None)
        if claimed is None:
            claimed = factory().export_class_name
        if claimed == class_name:
            claimants.append(name)
    return claimants[0] if len(claimants) == 1 else None


def family_of_folder(model_path) -> str | None:
    """The registered family of a diffusers pipeline folder, read from its model_index.json: the
    family whose transformer class the file's ``transformer`` entry names (StableDiffusion3Pipeline
    -> SD3Transformer2DModel -> sd3). None when the folder has no model_index.json (nothing to
    read); ConfigError (one line, naming the pipeline's _class_name) when the file is not JSON or
    names no single registered family."""
    import json
    from pathlib import Path

    index = Path(model_path) / "model_index.json"
    if not index.is_file():
        return None
    try:
        data = json.loads(index.read_text(encoding="utf-8"))
        entry = data.get("transformer")
        pipeline = data.get("_class_name")
    except (ValueError, OSError, AttributeError) as exc:
        raise ConfigError(f"{index} is not a diffusers model index ({exc.__class__.__name__}); pass --model_family "
                          "to say which model family the folder holds") from None
    cls = entry[1] if isinstance(entry, list) and len(entry) == 2 and isinstance(entry[1], str) else None
    _builtin()
    by_pipeline = [n for n, f in sorted(_REGISTRY.items())
                   if pipeline and getattr(f, "pipeline_class_name", None) == pipeline]
    if len(by_pipeline) == 1:  # a family that shares a transformer class names its own pipeline (Kontext)
        return by_pipeline[0]
    family = family_for_class_name(cls) if cls else None
    if family is None:
        raise ConfigError(f"{index}: pipeline {pipeline!r} (transformer {cls!r}) is no registered model family's "
                          f"({', '.join(sorted(_REGISTRY))}); pass --model_family NAME or pkg.module:Name")
    return family


def family_for_json_keys(keys) -> str | None:
    """The registered family whose videos2caption.json keys (``json_keys``) are exactly ``keys``;
    None when none, or more than one, has them (read from the classes, nothing is built)."""
    _builtin()
    wanted = set(keys)
    claimants = [name for name, factory in sorted(_REGISTRY.items())
                 if getattr(factory, "json_keys", None) and set(factory.json_keys) == wanted]
    return claimants[0] if len(claimants) == 1 else None
