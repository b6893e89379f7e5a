"""What --sp_size N costs and saves per rank (fastvideo.distributed.sequence_parallel), for the cost
model's ``--sp_table``.

Activation memory: each rank of a sequence group runs the transformer on L/N image tokens next to
the whole text. It is measured, not guessed: the meta-device forward (and backward) of
perf.memory.transformer_activation_peak on an image 1/N as tall (L/N tokens, the text unchanged).
The attention itself holds (L + T) tokens of H/N heads per rank where the measurement holds
L/N + T tokens of H heads: the same size within T (1 - 1/N) tokens of q / k / v, which the
measurement overcounts (an upper bound).

All-to-all bytes, per rank and per forward (B samples, inner = H x D, b bytes per element, A
attention layers): into the heads split the image q, k, v, 3 B (L/N) inner b; back, the image
outputs and every head's text output, B (L/N + T) inner b; a ring moves (N - 1)/N of each over the
links. The output all-gather adds B L C_out b. A training forward's backward repeats the exchanges,
activation checkpointing's recomputation once more.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

GIB = 2**30
MIB = 2**20


@dataclass(frozen=True)
class SpRow:
    sp: int
    rollout_activation_bytes: int  # one no-grad forward's peak, per rank
    train_activation_bytes: int  # one forward + backward's peak (activation checkpointing as given), per rank
    all_to_all_bytes_per_forward: int  # what this rank sends into all-to-alls in one forward
    gather_bytes_per_forward: int  # the output all-gather's result on this rank
    collectives_per_forward: int


def attention_layers(config: dict, family) -> tuple[int, int]:
    """(joint attention layers, image-only ones) the family's plan replaces (on the meta device)."""
    plan = family.sequence_parallel_plan()
    if plan is None:
        raise ValueError(f"model family {family.name!r} has no sequence-parallel plan")
    model = family.meta_transformer(config, torch.bfloat16)
    layers = plan.attention_layers(model)
    marked = {id(m) for m in plan.image_only(model)} if plan.image_only is not None else set()
    image_only = sum(1 for m in layers if id(m) in marked)
    return len(layers) - image_only, image_only


def exchange_bytes(inner: int, token_channels: int, layers: tuple[int, int], tokens: int, text_tokens: int, sp: int,
                   batch: int, element_bytes: int) -> tuple[int, int]:
    """(all-to-all bytes sent by one rank in one forward, output all-gather bytes); 0 at sp = 1.
    inner: heads x head dimension (family.attention_dims); token_channels: the gathered output's
    channels per split token (family.sequence_channels); layers: (joint, image-only) attention layers; tokens:
    the split image tokens (family.sequence_tokens; the table's: family.cost_sequence_tokens)."""
    if sp == 1:
        return 0, 0
    joint, image_only = layers
    per_layer = batch * inner * element_bytes * (4 * tokens // sp)
    text = batch * inner * element_bytes * text_tokens
    return (joint + image_only) * per_layer + joint * text, batch * tokens * token_channels * element_bytes


def family_exchange_bytes(config: dict, family, height: int, width: int, text_tokens: int, sp: int, batch: int,
                          element_bytes: int, layers: tuple[int, int] | None = None) -> tuple[int, int]:
    """exchange_bytes with the family's sizes at height x width."""
    heads, head_dim = family.attention_dims(config)
    tokens = family.cost_sequence_tokens(height, width, config)  # Kontext: its source tokens too
    channels = family.sequence_channels(config)
    layers = layers if layers is not None else attention_layers(config, family)
    return exchange_bytes(heads * head_dim, channels, layers, tokens, text_tokens, sp, batch, element_bytes)


def sp_rows(config: dict, family, height: int, width: int, text_tokens: int, sizes=(1, 2, 4), batch: int = 1,
            dtype=torch.bfloat16, checkpoint_fraction: float = 1.0) -> list[SpRow]:
    """One row per sequence-parallel size N (N must divide height / 16)."""
    from fastvideo.perf.memory import transformer_activation_peak

    layers = attention_layers(config, family)
    element = torch.tensor([], dtype=dtype).element_size()
    rows = []
    for sp in sizes:
        if (height // 16) % sp:
            raise ValueError(f"--sp_size {sp} does not divide the {height // 16} token rows of --h {height}")
        layout = family.nominal_layout(height // sp, width, config)
        peaks = [transformer_activation_peak(config, batch, layout, text_tokens, dtype, train,
                                             checkpoint_fraction=checkpoint_fraction, family=family)
                 for train in (False, True)]
        a2a, gathered = family_exchange_bytes(config, family, height, width, text_tokens, sp, batch, element, layers)
        rows.append(SpRow(sp, peaks[0], peaks[1], a2a, gathered, 0 if sp == 1 else 2 * sum(layers) + 1))
    return rows


def format_rows(rows: list[SpRow], desc: str, height: int, width: int, text_tokens: int) -> str:
    lines = [f"sequence parallelism, {desc} at {height}x{width} ({text_tokens} text tokens), per rank, batch 1, bf16:",
             f"{'sp':>3}{'rollout act GiB':>17}{'train act GiB':>15}{'all-to-all MiB/fwd':>20}"
             f"{'gather MiB/fwd':>16}{'collectives/fwd':>17}"]
    for r in rows:
        lines.append(f"{r.sp:>3}{r.rollout_activation_bytes / GIB:>17.2f}{r.train_activation_bytes / GIB:>15.2f}"
                     f"{r.all_to_all_bytes_per_forward / MIB:>20.1f}{r.gather_bytes_per_forward / MIB:>16.2f}"
                     f"{r.collectives_per_forward:>17}")
    lines.append("a training forward's backward repeats the exchanges; checkpointing's recomputation once more")
    return "\n".join(lines)
