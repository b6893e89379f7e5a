"""HunyuanVideo's sequence-parallel plan (models/hunyuan_video/sequence_parallel.py) on 2 gloo ranks, on
both library lines: the tiny transformer at sp = 2 against the stock diffusers forward and backward in
one process (output and every parameter's gradient to 1e-5), and the bytes its forward sends equal the
cost model's (perf.sequence_parallel). The inputs exercise what the split must get right: 3 latent
frames x 4 x 6 cells (18 video tokens after the 1x2x2 patches: the rank boundary, token 9, falls inside
the second frame; RoPE rows that differ by frame, row and column) next to 7 replicated Llama tokens
whose mask drops the last 3 of the second sample's (diffusers 0.32 masks a padded text position as key
and query, 0.42 as key). The reference runs each sample alone: diffusers 0.32's forward broadcasts its
[B, S, S] mask against the heads, per sample only for B = 1 (the 13B's 24 heads do not broadcast against
B = 2 at all); sequence parallelism masks each sample by its own text."""

from __future__ import annotations

import pytest
import torch
from dist_utils import run_distributed

from fastvideo.distributed import sequence_parallel
from fastvideo.distributed.parallel import ParallelDims

TEXT, MASKED = 7, 3


def _transformer():
    from diffusers import HunyuanVideoTransformer3DModel

    from fastvideo.tools.make_tiny_hunyuan_video import transformer_config
    from fastvideo.tools.tiny_builder import wake_zero_projections

    torch.manual_seed(0)
    model = HunyuanVideoTransformer3DModel.from_config(transformer_config())
    wake_zero_projections(model, 1)
    return model


def _inputs() -> dict:
    from fastvideo.tools.make_tiny_hunyuan_video import transformer_config

    c = transformer_config()
    g = torch.Generator().manual_seed(1000)
    mask = torch.ones(2, TEXT)
    mask[1, TEXT - MASKED:] = 0
    return {"hidden_states": torch.randn(2, c["in_channels"], 3, 4, 6, generator=g),
            "timestep": 1000 * torch.rand(2, generator=g),
            "encoder_hidden_states": torch.randn(2, TEXT, c["text_embed_dim"], generator=g),
            "encoder_attention_mask": mask, "pooled_projections": torch.randn(2, c["pooled_projection_dim"], generator=g),
            "guidance": torch.full((2,), 6000.0), "return_dict": False}


def _loss(out: torch.Tensor) -> torch.Tensor:
    w = torch.linspace(-1.0, 1.0, out.numel()).reshape(out.shape)
    return (out * w).sum() + out.square().mean()


def _reference():
    """Each sample's stock forward alone, the batch's loss on their outputs."""
    model, inputs = _transformer(), _inputs()
    outs = [model(**{k: v[i:i + 1] if isinstance(v, torch.Tensor) else v for k, v in inputs.items()})[0]
            for i in range(2)]
    out = torch.cat(outs)
    _loss(out).backward()
    return out.detach(), {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}


def _sp_forward(info):
    from fastvideo.distributed import comm_count
    from fastvideo.models.hunyuan_video.family import HunyuanVideoFamily

    dims = ParallelDims.build(info.world_size, info.rank, sp=info.world_size).init_groups()
    model = _transformer()
    swapped = sequence_parallel.install(model, HunyuanVideoFamily().sequence_parallel_plan(),
                                        sequence_parallel.sequence_shard(dims))
    comm_count.install()
    comm_count.reset()
    with comm_count.phase("rollout"):
        out = model(**_inputs())[0]
    counted = comm_count.metrics()
    _loss(out).backward()
    grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
    return out.detach(), grads, swapped, counted


def _close(got, want, what):
    torch.testing.assert_close(got, want, atol=1e-5 * float(want.abs().max()) + 1e-8, rtol=1e-5, msg=what)


def test_hunyuan_video_sp2_equals_one_process_and_sends_the_cost_models_bytes():
    """Every rank's output equals the one-process forward, the ranks' gradients average to its gradient,
    the 4 blocks' attention swapped; the forward's all-to-all and all-gather bytes are the cost model's
    for 9-frame clips at 32 x 48 pixels (18 tokens) and 7 text tokens, fp32."""
    from fastvideo.models.hunyuan_video.family import HunyuanVideoFamily
    from fastvideo.perf.sequence_parallel import attention_layers, family_exchange_bytes

    want_out, want_grads = _reference()
    ranks = run_distributed(_sp_forward)
    for out, _, swapped, _ in ranks:
        _close(out, want_out, "output")
        assert swapped == 4  # 2 dual-stream + 2 single-stream blocks; the token refiner keeps its own
    assert want_grads
    for n, want in want_grads.items():
        _close(sum(r[1][n] for r in ranks) / len(ranks), want, n)
    family = HunyuanVideoFamily(num_frames=9)
    config = dict(_transformer().config)
    assert family.sequence_tokens(32, 48, config) == 18
    layers = attention_layers(config, family)
    assert layers == (4, 0)
    a2a, gathered = family_exchange_bytes(config, family, 32, 48, TEXT, 2, 2, 4)
    m = ranks[0][3]
    assert m["comm/rollout/all_to_all_bytes"] == a2a and m["comm/rollout/all_to_all_calls"] == 2 * sum(layers)
    assert m["comm/rollout/all_gather_bytes"] == gathered and m["comm/rollout/all_gather_calls"] == 1


def _current_line_reason() -> str | None:
    from fastvideo.library_lines import CURRENT, LibraryLineError, require_line

    try:
        require_line(CURRENT, "HunyuanVideo's memory model (a meta-device forward)")
    except LibraryLineError as exc:
        return str(exc)
    return None


@pytest.mark.skipif(_current_line_reason() is not None, reason=_current_line_reason() or "")
def test_sp_table_counts_the_frames(tiny_hunyuan_video_dir, capsys):
    """cost_model --sp_table for HunyuanVideo (the current line: its memory model's meta-device forward)
    splits every latent frame's tokens: 9-frame clips (3 latent frames) gather 3/2 of 5-frame clips' (2)
    bytes and send 3/2 of their video q / k / v and outputs; the table prints rows for sp 1 and 2."""
    from fastvideo.models.hunyuan_video.family import HunyuanVideoFamily
    from fastvideo.perf.sequence_parallel import sp_rows
    from fastvideo.tools import cost_model

    config = dict(_transformer().config)
    five, nine = (sp_rows(config, HunyuanVideoFamily(num_frames=f), 32, 48, TEXT, sizes=(1, 2), batch=2,
                          dtype=torch.float32) for f in (5, 9))
    assert five[0].all_to_all_bytes_per_forward == nine[0].all_to_all_bytes_per_forward == 0
    assert 2 * nine[1].gather_bytes_per_forward == 3 * five[1].gather_bytes_per_forward > 0
    text = 4 * 2 * TEXT * 32 * 4  # 4 joint layers x batch 2 x 7 tokens x width 32 x fp32: frames do not change it
    assert 2 * (nine[1].all_to_all_bytes_per_forward - text) == 3 * (five[1].all_to_all_bytes_per_forward - text)
    assert nine[0].rollout_activation_bytes > five[0].rollout_activation_bytes
    cost_model.main(["--sp_table", "--model_family", "hunyuan_video", "--model", str(tiny_hunyuan_video_dir),
                     "--num_frames", "9", "--h", "32", "--w", "48", "--text_tokens", "7", "--sp_sizes", "1,2"])
    rows = [line.split() for line in capsys.readouterr().out.splitlines() if line.strip()[:1].isdigit()]
    assert [r[0] for r in rows] == ["1", "2"] and rows[1][-1] == "9"  # 2 all-to-alls x 4 blocks + 1 gather
