"""Checks of a stored prompt record against the dataset's first record and the transformer's config,
shared by the families' check_record / check_dims: each raises EmbeddingShapeError in one line naming
the fix."""

from __future__ import annotations

from typing import Any

from fastvideo.models.base import EmbeddingShapeError, config_value


def check_first_dims(idx: int, dims: tuple, first_dims: tuple | None, where: str, names: str = "(L, D)",
                     mix: str = "two preprocessing runs") -> None:
    """A stored record's dims against the dataset's first record's (None: this is the first):
    EmbeddingShapeError naming both when ``where`` mixes ``mix`` (an editing family's: "two
    preprocessing runs or source sizes")."""
    if first_dims is not None and dims != first_dims:
        raise EmbeddingShapeError(f"prompt {idx} has {names} = {dims} but prompt 0 has {first_dims}: "
                                  f"{where!r} mixes {mix} — re-run it into an empty folder")


def check_source_channels(channels: int, transformer_config: Any) -> None:
    """EmbeddingShapeError when an editing family's stored source latents of ``channels`` do not fit
    the transformer config's in_channels (not checked when the config has none)."""
    expected = config_value(transformer_config, "in_channels")
    if expected is not None and channels != expected:
        raise EmbeddingShapeError(f"source latents have {channels} channels but the transformer takes "
                                  f"in_channels {expected}: re-run preprocessing with this model's VAE")


def check_width(what: str, width: int, transformer_config: Any, key: str, hint: str) -> None:
    """EmbeddingShapeError when ``what`` (e.g. "prompt embeddings") of ``width`` do not fit the
    transformer config's ``key`` (not checked when the config has none); ``hint``: how to fix it."""
    expected = config_value(transformer_config, key)
    if expected is not None and width != expected:
        raise EmbeddingShapeError(f"{what} have width {width} but the transformer expects {key} {expected}: {hint}")


def check_sequence_length(seq: int, max_sequence_length: int | None) -> None:
    """Stored embeddings of ``seq`` tokens where --max_sequence_length asks for another length."""
    if max_sequence_length is not None and seq != max_sequence_length:
        raise EmbeddingShapeError(f"prompt embeddings have {seq} tokens but {max_sequence_length} are expected: "
                                  f"re-run preprocessing with --max_sequence_length {max_sequence_length}")
