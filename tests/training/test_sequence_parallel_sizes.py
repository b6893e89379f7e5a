"""--sp_size's start-up check counts the tokens the forward splits (family.sequence_tokens): Kontext's
generated tokens plus the stored source latents' (Qwen-Image-Edit's too), Z-Image's image tokens padded to 32 as its forward
pads them, SD3's patches. A bad combination is refused in one line before any model loads; one the
forward splits is accepted."""

from __future__ import annotations

import json

import pytest

from current_line_helpers import line_reason
from fastvideo.config import parse_config
from fastvideo.errors import ConfigError
from fastvideo.models.registry import family_factory
from fastvideo.training.builders import build_family, check_sequence_parallel
from helpers import train_args
from test_qwen_image_edit_training import edit_dir, edit_embeddings  # noqa: F401  (fixtures)


_model_dir = None


def _check(json_path, model_dir, tmp_path, **flags):
    cfg = parse_config(train_args(json_path, model_dir, tmp_path / "out", sp_size=2, **flags))
    check_sequence_parallel(cfg, build_family(cfg), 2)


@pytest.fixture(scope="module")
def kontext_48px_sources(tiny_kontext_dir, tmp_path_factory):
    """Two editing prompts with 48 x 48 source images: 9 source tokens (odd)."""
    from PIL import Image

    from fastvideo.data_preprocess.embeddings import PreprocessConfig, run_preprocess

    root = tmp_path_factory.mktemp("kontext48")
    lines = []
    for i, colour in enumerate(((255, 0, 0), (0, 0, 255))):
        Image.new("RGB", (48, 48), colour).save(root / f"{i}.png")
        lines.append(json.dumps({"prompt": f"make it green {i}", "image": f"{i}.png"}))
    (root / "prompts.jsonl").write_text("\n".join(lines) + "\n")
    cfg = PreprocessConfig(model_path=str(tiny_kontext_dir), prompt_file=str(root / "prompts.jsonl"),
                           output_dir=str(root / "emb"), max_sequence_length=32, batch_size=2,
                           dataloader_num_workers=0, model_family="kontext")
    return run_preprocess(cfg).json_path


def test_kontext_counts_the_source_tokens(tiny_kontext_dir, kontext_48px_sources, tmp_path):
    # 32 px: 4 generated + 9 source = 13 tokens: refused at start-up (the generated 4 alone would pass)
    with pytest.raises(ConfigError, match="does not divide the 13 image tokens") as err:
        _check(kontext_48px_sources, tiny_kontext_dir, tmp_path, model_family="kontext")
    assert "\n" not in str(err.value)
    # 48 px: 9 + 9 = 18 tokens split over 2 (the generated 9 alone would be refused)
    _check(kontext_48px_sources, tiny_kontext_dir, tmp_path, model_family="kontext", h=48, w=48)


def test_kontext_fixture_sources(tiny_kontext_dir, kontext_embeddings, tmp_path):
    family = family_factory("kontext")()
    config = json.loads((tiny_kontext_dir / "transformer" / "config.json").read_text())
    assert family.sequence_tokens(32, 32, config, (32, 8, 8, 16, 64, 64, 64)) == 4 + 16
    assert family.sequence_tokens(32, 32, config) == 4  # no embeddings read: the generated tokens
    _check(kontext_embeddings, tiny_kontext_dir, tmp_path, model_family="kontext")


@pytest.mark.skipif(line_reason("Z-Image") is not None, reason=line_reason("Z-Image") or "")
def test_zimage_checks_the_padded_tokens(tiny_zimage_dir, zimage_embeddings, tmp_path):
    global _model_dir
    _model_dir = tiny_zimage_dir
    family = family_factory("zimage")()
    config = json.loads((tiny_zimage_dir / "transformer" / "config.json").read_text())
    assert family.sequence_tokens(48, 48, config) == 32  # 3 x 3 = 9 tokens, padded to 32
    assert family.sequence_tokens(16 * 17, 16 * 2, config) == 64  # 34 tokens, padded to 64
    # 9 image tokens (odd) are padded to 32: accepted at sp = 2
    _check(zimage_embeddings, tiny_zimage_dir, tmp_path, model_family="zimage", h=48, w=48)
    # sp = 3 against 6 heads: 32 padded tokens are refused (an unpadded 9 would pass), 96 accepted
    six = tmp_path / "six_heads"
    six.mkdir()
    (six / "config.json").write_text(json.dumps({**config, "n_heads": 6, "n_kv_heads": 6}))
    with pytest.raises(ConfigError, match="does not divide the 32 image tokens"):
        check_sequence_parallel(_cfg(zimage_embeddings, six, tmp_path, h=48, w=48), family, 3)
    check_sequence_parallel(_cfg(zimage_embeddings, six, tmp_path, h=16 * 8, w=16 * 10), family, 3)  # 80 -> 96


def _cfg(json_path, transformer_dir, tmp_path, **flags):
    model_dir = _model_dir  # the transformer comes from --dit_model_name_or_path
    return parse_config(train_args(json_path, model_dir, tmp_path / "out", sp_size=3, model_family="zimage",
                                   dit_model_name_or_path=str(transformer_dir), **flags))


def test_sd3_counts_patches():
    config = {"patch_size": 2, "in_channels": 16}
    assert family_factory("sd3")().sequence_tokens(48, 48, config) == 9  # 6 x 6 latent cells, 3 x 3 patches


EDIT_REASON = line_reason("Qwen-Image-Edit")


@pytest.mark.skipif(EDIT_REASON is not None, reason=EDIT_REASON or "")
def test_qwen_image_edit_counts_the_source_tokens(edit_dir, edit_embeddings, tmp_path):
    """The tiny edit prompts' 64^2 VAE-area sources: 16 source tokens. At sp = 3 (a 6-head config): a
    3 x 2 generated grid (6 tokens, alone divisible) + 16 = 22 is refused in one line; a 2 x 1 grid
    (2 tokens, alone not) + 16 = 18 is accepted."""
    family = family_factory("qwen_image_edit")()
    config = json.loads((edit_dir / "transformer" / "config.json").read_text())
    assert family.sequence_tokens(32, 32, config, (320, 16, 16, 64, 64, 64)) == 4 + 16
    assert family.sequence_tokens(32, 32, config) == 4  # no embeddings read: the generated tokens
    six = tmp_path / "six_heads"
    six.mkdir()
    (six / "config.json").write_text(json.dumps({**config, "num_attention_heads": 6}))

    def cfg(h, w):
        return parse_config(train_args(edit_embeddings, edit_dir, tmp_path / "out", sp_size=3, h=h, w=w,
                                       model_family="qwen_image_edit", dit_model_name_or_path=str(six)))

    with pytest.raises(ConfigError, match="does not divide the 22 image tokens") as err:
        check_sequence_parallel(cfg(48, 32), family, 3)
    assert "\n" not in str(err.value)
    check_sequence_parallel(cfg(32, 16), family, 3)


@pytest.mark.skipif(EDIT_REASON is not None, reason=EDIT_REASON or "")
def test_qwen_image_edit_indivisible_tokens_exit_2_in_one_line(edit_dir, edit_embeddings, tmp_path):
    """Through the trainer on 2 ranks at 48 px: 9 generated + 16 source = 25 tokens, refused before any
    model loads, each rank exiting 2 with the one line (the real torchrun: its summary names the exit code)."""
    from helpers import torchrun

    argv = train_args(edit_embeddings, edit_dir, tmp_path / "out", sp_size=2, h=48, w=48,
                      model_family="qwen_image_edit")
    proc = torchrun(argv, nproc=2, real=True)
    lines = [line for line in proc.stderr.splitlines() if "does not divide the 25 image tokens" in line]
    assert len(lines) == 1, proc.stderr[-3000:]
    # the only traceback is torchrun's own ChildFailedError: no frame of the project's code
    assert not [line for line in proc.stderr.splitlines() if 'File "' in line and "fastvideo" in line], proc.stderr
    assert proc.returncode == 1 and proc.stderr.count("exitcode  : 2") == 2, proc.stderr[-3000:]
