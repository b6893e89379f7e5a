"""Ulysses sequence parallelism: the N ranks of a sequence group split one forward's image tokens.

    shard = sequence_shard(dims)                    # None while --sp_size 1
    install(transformer, family.sequence_parallel_plan(), shard)   # once, after wrapping

The design (docs/parallelism.md):

- Outside the transformer nothing is split: every rank of a sequence group holds the same samples,
  the whole latents and the same random draws, so the SDE maths, log-probabilities, decoding,
  rewards, advantages and checkpoints are those of one rank. Inside the transformer a forward hook
  on the family's token embedder keeps this rank's 1/N of the image tokens, a hook on its RoPE
  module keeps the matching rows of the position tables (the text rows, then this rank's image
  rows), and a hook on its output projection all-gathers the tokens again.
- Text tokens stay replicated on every rank (any text length works, no padding); image tokens are
  split. Attention: the image q / k / v go from sequence-split to head-split with one all-to-all,
  each rank takes its heads of the (replicated) text q / k / v locally, attends over all tokens for
  H / N heads, and one all-to-all sends the image outputs home and every rank's heads of the text
  output to every rank. The backward of those exchanges is the same exchange; the text rows that
  were copied into every rank's message sum their gradients there, so each rank's parameter
  gradient is its part of the sequence group's gradient.
- Gradients: every rank of a group computes the same loss from the gathered output. The gather's
  backward hands each rank the gradient of its own tokens times N; FSDP averages gradients over
  the whole world (dp x sp ranks), so the sum of the N parts times N divided by dp x sp is the
  data-parallel average of the one-rank gradients.

Collectives: ``all_to_all_single`` on contiguous tensors and ``all_gather`` into a list, in the
tensors' own dtypes (HCCL carries fp32, bf16 and fp16 in both; tests/hccl_rules.py). No value is
read back to the host.

A family takes part by returning a :class:`SequenceParallelPlan` from
``family.sequence_parallel_plan()``: the module names above and its attention processor, which
calls :meth:`SequenceShard.attention` where the stock processor calls its attention kernel.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

import torch

from fastvideo.errors import ConfigError


def _exchange(x: torch.Tensor, group) -> torch.Tensor:
    """x [N, ...]: chunk j goes to rank j of ``group``; returns [N, ...] whose chunk i came from rank i."""
    import torch.distributed as dist

    x = x.contiguous()
    out = torch.empty_like(x)
    dist.all_to_all_single(out, x, group=group)
    return out


class _Exchange(torch.autograd.Function):
    """All-to-all of the leading dimension; its backward is the same exchange of the gradients."""

    @staticmethod
    def forward(ctx, x, group):
        ctx.group = group
        return _exchange(x, group)

    @staticmethod
    def backward(ctx, grad):
        return _exchange(grad, ctx.group), None


class _Gather(torch.autograd.Function):
    """Tokens [B, L/N, ...] of every rank -> [B, L, ...] in rank order. Backward: this rank's tokens'
    gradient times N (every rank computed the same loss from the gathered tensor; see the module
    docstring for why N)."""

    @staticmethod
    def forward(ctx, x, group, size, rank):
        import torch.distributed as dist

        ctx.size, ctx.rank, ctx.local = size, rank, x.shape[1]
        parts = [torch.empty_like(x, memory_format=torch.contiguous_format) for _ in range(size)]
        dist.all_gather(parts, x.contiguous(), group=group)
        return torch.cat(parts, dim=1)

    @staticmethod
    def backward(ctx, grad):
        mine = grad.narrow(1, ctx.rank * ctx.local, ctx.local)
        return mine * ctx.size, None, None, None


class SequenceShard:
    """This rank's place in its sequence group and the token split of the forward in flight."""

    def __init__(self, group, size: int, rank: int):
        self.group, self.size, self.rank = group, size, rank
        self.full_tokens: int | None = None  # the image tokens of the forward in flight (set by split)

    @property
    def local_tokens(self) -> int:
        return self.full_tokens // self.size

    def _offset(self) -> int:
        return self.rank * self.local_tokens

    def split(self, x: torch.Tensor) -> torch.Tensor:
        """[B, L, D] -> this rank's [B, L/N, D] (tokens rank*L/N .. (rank+1)*L/N - 1)."""
        tokens = x.shape[1]
        if tokens % self.size:
            raise ValueError(f"{tokens} image tokens do not split over --sp_size {self.size}")
        self.full_tokens = tokens
        return x.narrow(1, self._offset(), self.local_tokens)

    def local(self, x: torch.Tensor, dim: int = 1) -> torch.Tensor:
        """This rank's rows along ``dim`` of a tensor with one row per image token of the forward in
        flight (after split): per-token timestep embeddings, position tables of the image tokens alone."""
        return x.narrow(dim, self._offset(), self.local_tokens)

    def split_rows(self, table: torch.Tensor) -> torch.Tensor:
        """Position table [S_text + L, ...] (text rows first) -> [S_text + L/N, ...]: the text rows
        and this rank's image rows, so that RoPE follows the split."""
        text = table.shape[0] - self.full_tokens
        return torch.cat([table[:text], table.narrow(0, text + self._offset(), self.local_tokens)])

    def gather(self, y: torch.Tensor) -> torch.Tensor:
        """[B, L/N, C] of every rank -> [B, L, C]."""
        return _Gather.apply(y, self.group, self.size, self.rank)

    def attention(self, q, k, v, text_tokens: int, text_first: bool, attend: Callable) -> torch.Tensor:
        """Joint attention over the replicated text and every rank's image tokens.

        q, k, v [B, H, S, D] with S = text_tokens + L/N (the text rows first or last, as the
        family's processor concatenates them), RoPE already applied; attend(q, k, v) -> [B, h, S', D]
        is the family's kernel. Returns [B, H, S, D] in the input's token order: this rank's image
        tokens and the text tokens, every head."""
        n, h = self.size, q.shape[1] // self.size
        local = q.shape[2] - text_tokens

        def parts(t):
            return (t[:, :, :text_tokens], t[:, :, text_tokens:]) if text_first else \
                (t[:, :, local:], t[:, :, :local])

        texts, images = zip(*(parts(t) for t in (q, k, v)))
        images = _seq_to_heads(images, self.group, n, h)  # [B, h, L, D] each
        texts = [t.unflatten(1, (n, h))[:, self.rank] for t in texts]  # this rank's heads of the text
        joint = [torch.cat((t, i) if text_first else (i, t), dim=2) for t, i in zip(texts, images)]
        out = attend(*joint)  # [B, h, S_text + L, D]
        cut = text_tokens if text_first else out.shape[2] - text_tokens
        text_out, image_out = (out[:, :, :cut], out[:, :, cut:]) if text_first else (out[:, :, cut:], out[:, :, :cut])
        image_out, text_out = _heads_to_seq(image_out, text_out, self.group, n)
        return torch.cat((text_out, image_out) if text_first else (image_out, text_out), dim=2)


def _seq_to_heads(tensors, group, n: int, h: int) -> list[torch.Tensor]:
    """[B, H, L/N, D] tensors split by tokens -> [B, H/N, L, D] split by heads: one exchange for
    tensors of one dtype (under autocast q / k can be fp32 next to a bf16 v: then one each)."""
    if len({t.dtype for t in tensors}) > 1:
        return [_seq_to_heads([t], group, n, h)[0] for t in tensors]
    x = torch.stack(tensors)  # [T, B, H, s, D]
    x = x.unflatten(2, (n, h)).movedim(2, 0)  # [N (to rank), T, B, h, s, D]
    y = _Exchange.apply(x, group)  # [N (from rank: its tokens), T, B, h, s, D]
    y = y.permute(1, 2, 3, 0, 4, 5).flatten(3, 4)  # [T, B, h, N*s, D]
    return list(y.unbind(0))


def _heads_to_seq(image: torch.Tensor, text: torch.Tensor, group, n: int) -> tuple[torch.Tensor, torch.Tensor]:
    """image [B, h, L, D] and text [B, h, S_text, D] of this rank's heads -> image [B, H, L/N, D]
    (this rank's tokens) and text [B, H, S_text, D] (every head), by one exchange: the message to
    rank j is its image tokens and this rank's text output."""
    s, text_tokens = image.shape[2] // n, text.shape[2]
    img = image.unflatten(2, (n, s)).movedim(2, 0)  # [N (to rank), B, h, s, D]
    msg = torch.cat([img, text.unsqueeze(0).expand(n, *text.shape)], dim=3)  # [N, B, h, s + S_text, D]
    got = _Exchange.apply(msg, group)  # [N (from rank: its heads), B, h, s + S_text, D]
    got = got.movedim(0, 1).flatten(1, 2)  # [B, H, s + S_text, D]
    return got[:, :, :s], got[:, :, s:s + text_tokens]


@dataclass(frozen=True)
class SequenceParallelPlan:
    """What a family names for sequence parallelism (modules by their path in the diffusers model).

    split: the module whose output [B, L, D] is the image-token sequence (its tokens are split);
    gather: the module whose output [B, L/N, C] ends the image-token path (gathered back);
    rope: the module mapping position ids [S_text + L, ...] to tables whose rows follow the tokens
        (a tensor or a tuple of them), or None (absolute positions added before ``split``);
    processor: shard -> the attention processor that attends through SequenceShard.attention;
    replaces: the processor classes it replaces (every attention module holding one);
    image_only: model -> the attention modules that attend over the image tokens alone (the cost
        model's byte count; those of them the plan replaces count);
    hooks: (model, shard) -> None for a forward whose token path no module output marks (split,
        gather and rope then None: the family splits and gathers in it itself);
    attention_modules: model -> the modules whose processors may be replaced (default: all; a
        family whose text-only layers share the processor class names the others);
    heads_key: the transformer config's attention-head count (checked against --sp_size)."""

    split: str | None
    gather: str | None
    processor: Callable[[SequenceShard], Any]
    replaces: tuple[type, ...]
    rope: str | None = None
    image_only: Callable[[torch.nn.Module], Any] | None = None
    hooks: Callable[[torch.nn.Module, SequenceShard], None] | None = None
    attention_modules: Callable[[torch.nn.Module], Any] | None = None
    heads_key: str = "num_attention_heads"

    def attention_layers(self, model: torch.nn.Module) -> list[torch.nn.Module]:
        """The modules of ``model`` (unwrapped) whose processors the plan replaces."""
        scope = model.modules() if self.attention_modules is None else self.attention_modules(model)
        return [m for m in scope if isinstance(getattr(m, "processor", None), self.replaces)]


def sequence_shard(dims) -> SequenceShard | None:
    """The shard of a ParallelDims (groups made: dims.init_groups()); None while sp = 1."""
    if dims is None or dims.sp == 1:
        return None
    return SequenceShard(dims.sp_group, dims.sp, dims.sp_rank)


def _inner(model: torch.nn.Module) -> torch.nn.Module:
    """The diffusers model inside FSDP / DDP wrappers."""
    while hasattr(model, "module") and isinstance(model.module, torch.nn.Module):
        model = model.module
    return model


def install(model: torch.nn.Module, plan: SequenceParallelPlan, shard: SequenceShard) -> int:
    """Hooks and processors of ``plan`` on ``model`` (wrapped or not); returns the processors set."""
    inner = _inner(model)
    if plan.split is not None:
        inner.get_submodule(plan.split).register_forward_hook(lambda m, i, out: shard.split(out))
    if plan.gather is not None:
        inner.get_submodule(plan.gather).register_forward_hook(lambda m, i, out: shard.gather(out))
    if plan.hooks is not None:
        plan.hooks(inner, shard)
    if plan.rope is not None:
        def rows(m, i, out):
            return tuple(shard.split_rows(t) for t in out) if isinstance(out, tuple) else shard.split_rows(out)

        inner.get_submodule(plan.rope).register_forward_hook(rows)
    swapped = 0
    for module in plan.attention_layers(inner):
        module.processor = plan.processor(shard)
        swapped += 1
    if not swapped:
        raise ValueError(f"no attention processor of {[c.__name__ for c in plan.replaces]} in {type(inner).__name__}")
    return swapped


def check_sizes(sp: int, world_size: int, heads: int | None, image_tokens: int | None, family_name: str,
                has_plan: bool) -> None:
    """One line (ConfigError) when --sp_size cannot split this run (heads / tokens None: unknown)."""
    if sp == 1:
        return
    if not has_plan:
        raise ConfigError(f"--sp_size {sp}: model family {family_name!r} has no sequence-parallel plan; use --sp_size 1")
    if world_size % sp:
        raise ConfigError(f"--sp_size {sp} does not divide the world size {world_size}: use a divisor of the number "
                          "of processes")
    if heads is not None and int(heads) % sp:
        raise ConfigError(f"--sp_size {sp} does not divide the transformer's {heads} attention heads: use a divisor "
                          "of the head count")
    if image_tokens is not None and image_tokens % sp:
        raise ConfigError(f"--sp_size {sp} does not divide the {image_tokens} image tokens a forward splits at --h/--w "
                          "(with a source image's, padding included): use a divisor, or a size whose token count it "
                          "divides")
