"""The two library lines, and every place where they differ.

The project runs on two tested sets of diffusers / transformers / peft (constraints/<line>.txt):

    recipe   diffusers 0.32.0, transformers 4.46.1, peft 0.13.2   the Ascend recipe's pins (late 2024)
    current  diffusers 0.42.1, transformers 5.24.0, peft 0.21.2   the families that exist only there

Code that must behave differently on the two lines asks this module (one function per
difference) instead of comparing versions itself:

    library_line()                   -> "recipe" | "current" (what this environment has)
    require_line(line, what)         a LibraryLineError (exit 2) naming both lines and the install command
    check_recorded_line(line, what)  the same for a checkpoint or folder written on the other line
    projected_features(output)       CLIP's image/text features (a tensor on 4.x, an output object on 5)
    flux_blocks()                    diffusers' FLUX classes that differ (rotary embedding, attention processors)
    attention_module_classes()       diffusers' attention layer classes (FLUX's has its own on 0.42), for isinstance

Nothing here imports diffusers, transformers or peft at module level: the line is read from the
installed distributions' metadata, so asking costs no import.
"""

from __future__ import annotations

import importlib.metadata
from dataclasses import dataclass
from functools import lru_cache

from fastvideo.errors import UserError

RECIPE = "recipe"
CURRENT = "current"


@dataclass(frozen=True)
class LineSpec:
    """A library line's tested pins (the same as constraints/<name>.txt)."""

    name: str
    diffusers: str
    transformers: str
    peft: str

    def install_command(self) -> str:
        return f"bash env_setup.sh --line {self.name}"

    def describe(self) -> str:
        return (f"the {self.name} line (diffusers {self.diffusers}, transformers {self.transformers}, "
                f"peft {self.peft})")


LINES = {
    RECIPE: LineSpec(RECIPE, diffusers="0.32.0", transformers="4.46.1", peft="0.13.2"),
    CURRENT: LineSpec(CURRENT, diffusers="0.42.1", transformers="5.24.0", peft="0.21.2"),
}
# diffusers releases from this one on belong to the current line (0.40 is the oldest with the
# pipelines of the current families; between 0.32 and 0.40 nothing is tested).
CURRENT_FROM_DIFFUSERS = (0, 40)


class LibraryLineError(UserError):
    """A feature or a file of one library line used in an environment of the other (exit 2)."""


def _major_minor(version: str) -> tuple[int, int]:
    parts = version.split(".")
    return int(parts[0]), int("".join(ch for ch in parts[1] if ch.isdigit()) or 0)


def line_of_diffusers(version: str) -> str:
    """The library line a diffusers version belongs to."""
    return CURRENT if _major_minor(version) >= CURRENT_FROM_DIFFUSERS else RECIPE


@lru_cache(maxsize=None)
def installed_version(distribution: str) -> str | None:
    try:
        return importlib.metadata.version(distribution)
    except importlib.metadata.PackageNotFoundError:
        return None


def library_line() -> str:
    """The line this environment runs: decided by its diffusers (transformers and peft follow it
    through the constraints files)."""
    version = installed_version("diffusers")
    return line_of_diffusers(version) if version else RECIPE


def is_current() -> bool:
    return library_line() == CURRENT


def _other(line: str) -> str:
    return CURRENT if line == RECIPE else RECIPE


def require_line(line: str, what: str) -> None:
    """Refuse ``what`` (e.g. "model family 'flux2'") unless this environment runs ``line``."""
    if line not in LINES:
        raise ValueError(f"unknown library line {line!r}")
    here = library_line()
    if here != line:
        spec = LINES[line]
        raise LibraryLineError(
            f"{what} needs {spec.describe()}, but this environment runs {LINES[here].describe()}; install "
            f"the {line} line with `{spec.install_command()}` and run with its environment"
            f"{' (.venv-current)' if line == CURRENT else ' (.venv)'}")


def check_recorded_line(recorded: str | None, what: str) -> str | None:
    """A checkpoint or folder that records the line it was written on. Returns a start-up note
    when it was written on the other line (its contents are diffusers-named and read on both lines),
    raises for an unknown line, and returns None when the lines agree or nothing was recorded."""
    if recorded is None:
        return None
    if recorded not in LINES:
        raise LibraryLineError(
            f"{what} records the library line {recorded!r}, which this release does not know (it knows "
            f"{', '.join(LINES)}): resume it with the flux-grpo release that wrote it")
    here = library_line()
    if recorded == here:
        return None
    return (f"{what} was written on {LINES[recorded].describe()} and is read on {LINES[here].describe()}; "
            f"the weights, optimizer and adapter files are read by name on both lines (to continue on the "
            f"original line instead: `{LINES[recorded].install_command()}`)")


def line_summary() -> str:
    """One phrase for start-up and dry-run lines: ``recipe (diffusers 0.32.0, transformers 4.46.1)``."""
    versions = ", ".join(f"{name} {installed_version(name) or 'missing'}" for name in ("diffusers", "transformers"))
    return f"{library_line()} ({versions})"


def projected_features(output):
    """``CLIPModel.get_image_features`` / ``get_text_features`` -> the projected embeddings ``[B, D]``.
    transformers 4.x returns the tensor; transformers 5 returns a ``BaseModelOutputWithPooling`` whose
    ``pooler_output`` holds the same projection."""
    return output if hasattr(output, "float") else output.pooler_output


# ---------------------------------------------------------------- diffusers' FLUX building blocks
# Where diffusers keeps FLUX's building blocks, on each library line this project supports.
#
# The recipe line (diffusers 0.32) and the current line (0.42) build the same FLUX transformer from
# differently named pieces:
#
# ============================  =======================================  =================================
# piece                         0.32                                     0.42
# ============================  =======================================  =================================
# attention module              ``attention_processor.Attention``        ``transformer_flux.FluxAttention``
# stock attention processor(s)  ``attention_processor.FluxAttnProcessor  ``transformer_flux.FluxAttnProcessor``
#                               2_0`` and its ``_NPU`` twin              (what the deprecated ``*2_0`` names
#                                                                        now return)
# q/k RMS norms                 ``normalization.RMSNorm``                ``torch.nn.RMSNorm``
# rotary embedding              ``embeddings.FluxPosEmbed``              ``transformer_flux.FluxPosEmbed``
# ============================  =======================================  =================================
#
# Both RMS norm classes exist on both lines, so code that handles both needs no line check; the two
# rows that do differ are answered here, and only here. The line is told by what diffusers defines
# (``transformer_flux.FluxAttnProcessor`` exists on 0.42, not on 0.32), not by its version string.


@dataclass(frozen=True)
class FluxBlocks:
    """The installed diffusers' FLUX classes that differ between the library lines."""

    pos_embed: type  # FLUX's rotary embedding module (no parameters)
    processors: tuple[type, ...]  # the stock processors of FLUX's joint and single attention


@lru_cache(maxsize=None)
def flux_blocks() -> FluxBlocks:
    """:class:`FluxBlocks` of the installed diffusers (imported on first call)."""
    from diffusers.models.transformers import transformer_flux

    if hasattr(transformer_flux, "FluxAttnProcessor"):  # current line (0.42)
        return FluxBlocks(transformer_flux.FluxPosEmbed, (transformer_flux.FluxAttnProcessor,))
    from diffusers.models import attention_processor, embeddings  # recipe line (0.32)

    return FluxBlocks(
        embeddings.FluxPosEmbed,
        (attention_processor.FluxAttnProcessor2_0, attention_processor.FluxAttnProcessor2_0_NPU),
    )


@lru_cache(maxsize=None)
def attention_module_classes() -> tuple[type, ...]:
    """The diffusers classes an attention layer is an instance of, for ``isinstance`` on either line.

    0.32: every model's attention is ``attention_processor.Attention``. 0.42 keeps that class for
    the older models (SD3's among them) and gives the newer ones their own classes (FLUX's
    ``FluxAttention``) sharing ``attention.AttentionModuleMixin`` and not ``Attention``.
    """
    from diffusers.models.attention_processor import Attention

    try:
        from diffusers.models.attention import AttentionModuleMixin
    except ImportError:  # the recipe line: no per-model attention classes yet
        return (Attention,)
    return (Attention, AttentionModuleMixin)


# ---------------------------------------------------------------- library noise off a terminal
class _EmptyFp32ListWarning:
    """diffusers 0.42 warns on every ``model.to(dtype)`` of a model whose ``_keep_in_fp32_modules``
    is an empty list ("... should be kept in float32: []"): nothing is kept in float32, so the
    warning says nothing; it would break every one-line error report on the current line."""

    def filter(self, record) -> bool:
        return "should be kept in float32: []" not in str(record.msg)


def quiet_library_noise(stream=None) -> None:
    """Called once when fastvideo is imported. Off a terminal (a batch job's log), the libraries'
    progress bars are off: transformers 5 draws a "Loading weights" bar for every model it loads,
    and it reads huggingface_hub's HF_HUB_DISABLE_PROGRESS_BARS when it is imported (a value the
    user set is kept). diffusers 0.42's empty float32-module warning is dropped on both lines."""
    import logging
    import os
    import sys

    stream = stream if stream is not None else sys.stderr
    try:
        terminal = stream.isatty()
    except (AttributeError, ValueError):
        terminal = False
    if not terminal:
        os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
    logger = logging.getLogger("diffusers.models.modeling_utils")
    if not any(isinstance(f, _EmptyFp32ListWarning) for f in logger.filters):
        logger.addFilter(_EmptyFp32ListWarning())
