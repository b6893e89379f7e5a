"""FLUX prompt-embedding preprocessing: layout, rank-count independence, resume, launcher."""

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from fastvideo.data.dataset import EmbeddingShapeError, PromptEmbeddingDataset
from fastvideo.data.prompts import PromptFileError
from fastvideo.errors import ConfigError
from fastvideo.data_preprocess.embeddings import batch_grid, rank_batches, subdirs
from fastvideo.data_preprocess.preprocess_embeddings import main, parse_args
from fastvideo.models.flux.family import FluxFamily

FLUX = FluxFamily()  # the family of these tests' records (FLUX's)

REPO = Path(__file__).resolve().parents[2]
TINY_PROMPTS = REPO / "assets" / "prompts_tiny.txt"
LAUNCHER = REPO / "scripts" / "preprocess" / "preprocess_flux_rl_embeddings.sh"
BATCH = 3  # 8 prompts -> batches of 3, 3, 2: a short last batch and two ranks with unequal work
SEQ = 128  # shorter than the default 512 to keep the tests fast; the layout is the same


def run(model, out, prompts=TINY_PROMPTS, *extra):
    return main(
        ["--model_path", str(model), "--prompt_dir", str(prompts), "--output_dir", str(out),
         "--batch_size", str(BATCH), "--max_sequence_length", str(SEQ), *map(str, extra)]
    )


def assert_same_output(a: Path, b: Path) -> None:
    assert (a / "videos2caption.json").read_text() == (b / "videos2caption.json").read_text()
    for sub in subdirs(family=FLUX):
        names = sorted(p.name for p in (a / sub).glob("*.pt"))
        assert names == sorted(p.name for p in (b / sub).glob("*.pt")), sub
        for name in names:
            ta = torch.load(a / sub / name, weights_only=True)
            tb = torch.load(b / sub / name, weights_only=True)
            assert ta.dtype == tb.dtype and torch.equal(ta, tb), f"{sub}/{name} differs"


@pytest.fixture(scope="module")
def reference(tiny_flux_dir, tmp_path_factory):
    """One process, in this interpreter."""
    out = tmp_path_factory.mktemp("emb_1rank")
    result = run(tiny_flux_dir, out)
    assert result.num_prompts == result.num_encoded == 8 and result.num_already_encoded == 0
    return out


@pytest.fixture(scope="module")
def launched(tiny_flux_dir, tmp_path_factory):
    """The shell launcher, unchanged, on CPU: torchrun with 2 gloo processes."""
    out = tmp_path_factory.mktemp("emb_2rank")
    # PYTHON: the launcher runs this interpreter's library line (left to itself it picks .venv, the
    # recipe line, whose text encoders compute in another order than the current line's).
    env = {**os.environ, "FASTVIDEO_DEVICE": "cpu", "PYTHON": sys.executable, "MODEL_PATH": str(tiny_flux_dir),
           "PROMPT_FILE": str(TINY_PROMPTS), "OUTPUT_DIR": str(out), "BATCH_SIZE": str(BATCH),
           "MAX_SEQ_LEN": str(SEQ)}
    env.pop("NPROC", None)
    start = time.perf_counter()
    proc = subprocess.run(["bash", str(LAUNCHER)], env=env, capture_output=True, text=True, timeout=300)
    return proc, out, time.perf_counter() - start


def test_layout_values_and_dataset(reference, tiny_flux_dir):
    from fastvideo.models.flux import encode_prompts, load_text_encoders

    prompts = TINY_PROMPTS.read_text().splitlines()
    entries = json.loads((reference / "videos2caption.json").read_text())
    assert entries == [
        {"prompt_embed_path": f"{i}.pt", "text_ids": f"{i}.pt", "pooled_prompt_embeds_path": f"{i}.pt", "caption": p}
        for i, p in enumerate(prompts)
    ]
    encoders = load_text_encoders(tiny_flux_dir)
    for batch in batch_grid(8, BATCH):
        embeds, pooled, ids = encode_prompts(encoders, [prompts[i] for i in batch], SEQ)
        for row, idx in enumerate(batch):
            files = [torch.load(reference / sub / f"{idx}.pt", weights_only=True) for sub in subdirs(family=FLUX)]
            for t in files:  # plain CPU tensors that own exactly their bytes
                assert type(t) is torch.Tensor and t.dtype == torch.float32
                assert t.untyped_storage().nbytes() == t.numel() * t.element_size()
            assert torch.equal(files[0], embeds[row]) and files[0].shape == (SEQ, 32)
            assert torch.equal(files[1], pooled[row]) and files[1].shape == (32,)
            assert torch.equal(files[2], ids[row]) and files[2].shape == (3,) and not files[2].any()  # upstream: one row
    config = json.loads((tiny_flux_dir / "transformer" / "config.json").read_text())
    ds = PromptEmbeddingDataset(reference / "videos2caption.json", expected=config, family=FLUX)
    assert ds.dims() == (SEQ, 32, 32) and ds[7][3] == prompts[7]
    with pytest.raises(EmbeddingShapeError, match="width 32 but the transformer expects joint_attention_dim 4096"):
        ds.check_against_transformer({**config, "joint_attention_dim": 4096})


def test_launcher_runs_two_cpu_processes(launched):
    proc, out, seconds = launched
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "preprocess: 2 x cpu" in proc.stdout and "on 2 x cpu (torch.float32)" in proc.stdout
    assert "wrote 8 prompts" in proc.stdout and "prompts/s" in proc.stdout
    # A log, not a terminal: plain progress lines, no bar redraws (fastvideo/progress.py).
    assert "encoding (rank 0 of 2): 5/5 prompt (100%)" in proc.stderr and "\r" not in proc.stderr
    assert "rank 1 of 2" not in proc.stderr, "only rank 0 shows progress"
    print(f"launcher, 2 CPU processes, 8 prompts: {seconds:.1f} s")


def test_two_ranks_match_one_rank_bit_for_bit(reference, launched):
    proc, out, _ = launched
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert_same_output(reference, out)


def test_rank_shards_are_disjoint_and_cover():
    grid = batch_grid(8, 3)
    shards = [rank_batches(grid, r, 2) for r in range(2)]
    assert shards == [[[0, 1, 2], [6, 7]], [[3, 4, 5]]]
    # --max_prompts keeps batch mates: prompt 4 sits in [3, 4, 5] whatever the cap
    assert batch_grid(5, 3, num_available=8) == [[0, 1, 2], [3, 4, 5]]


def test_resume_skips_complete_prompts_and_redoes_broken_ones(reference, tiny_flux_dir, tmp_path, capsys):
    out = tmp_path / "emb"
    shutil.copytree(reference, out)
    (out / "prompt_embed" / "4.pt").unlink()  # missing
    (out / "text_ids" / "6.pt").write_bytes((reference / "text_ids" / "6.pt").read_bytes()[:100])  # cut short
    (out / "videos2caption.json").unlink()  # an interrupted run never wrote it
    untouched = (out / "prompt_embed" / "0.pt").stat()
    result = run(tiny_flux_dir, out)
    assert "6 of 8 prompts already encoded, encoding the remaining 2" in capsys.readouterr().out
    assert (result.num_already_encoded, result.num_encoded) == (6, 2)
    assert_same_output(reference, out)
    again = (out / "prompt_embed" / "0.pt").stat()
    assert (again.st_ino, again.st_mtime_ns) == (untouched.st_ino, untouched.st_mtime_ns), "complete prompt rewritten"


def test_capped_run_then_full_run_equals_one_full_run(reference, tiny_flux_dir, tmp_path, capsys):
    out = tmp_path / "emb"
    first = run(tiny_flux_dir, out, TINY_PROMPTS, "--max_prompts", 5)
    assert first.num_encoded == 5 and len(json.loads((out / "videos2caption.json").read_text())) == 5
    second = run(tiny_flux_dir, out)
    assert "5 of 8 prompts already encoded, encoding the remaining 3" in capsys.readouterr().out
    assert second.num_encoded == 3
    assert_same_output(reference, out)


def test_changed_captions_and_settings_are_not_reused(reference, tiny_flux_dir, tmp_path, capsys):
    out = tmp_path / "emb"
    shutil.copytree(reference, out)
    lines = TINY_PROMPTS.read_text().splitlines()
    lines[2] = "a completely different prompt about a violet submarine"
    edited = tmp_path / "edited.txt"
    edited.write_text("\n".join(lines) + "\n")
    before = sorted(p.name for p in (out / "prompt_embed").iterdir())
    with pytest.raises(ConfigError, match=r"1 prompts whose captions differ .*first: prompt 2.*--overwrite"):
        run(tiny_flux_dir, out, edited)
    assert sorted(p.name for p in (out / "prompt_embed").iterdir()) == before  # nothing deleted unasked
    result = run(tiny_flux_dir, out, edited, "--overwrite")
    printed = capsys.readouterr().out
    assert "removed the files of 1 prompts" in printed and result.num_encoded == 1
    new = torch.load(out / "prompt_embed" / "2.pt", weights_only=True)
    assert not torch.equal(new, torch.load(reference / "prompt_embed" / "2.pt", weights_only=True))
    assert json.loads((out / "videos2caption.json").read_text())[2]["caption"] == lines[2]
    with pytest.raises(ConfigError, match=r"8 prompts made with other settings \(differing: max_sequence_length, shapes\)"):
        run(tiny_flux_dir, out, edited, "--max_sequence_length", 64)
    shorter = run(tiny_flux_dir, out, edited, "--max_sequence_length", 64, "--overwrite")
    assert shorter.num_encoded == 8 and "removed the files of 8 prompts" in capsys.readouterr().out
    assert torch.load(out / "prompt_embed" / "0.pt", weights_only=True).shape == (64, 32)


def test_bad_inputs_fail_early(tiny_flux_dir, tmp_path):
    with pytest.raises(ValueError, match="--max_sequence_length must be in 1..512"):
        run(tiny_flux_dir, tmp_path, TINY_PROMPTS, "--max_sequence_length", 600)
    with pytest.raises(ValueError, match="--batch_size must be at least 1"):
        run(tiny_flux_dir, tmp_path, TINY_PROMPTS, "--batch_size", 0)
    with pytest.raises(PromptFileError, match="does not exist"):
        run(tiny_flux_dir, tmp_path, tmp_path / "missing.txt")
    cjk = tmp_path / "cjk.txt"
    cjk.write_text("一只猫\n一只狗\n", encoding="utf-8")
    with pytest.raises(PromptFileError, match="2 dropped for CJK characters"):
        run(tiny_flux_dir, tmp_path, cjk)
    from fastvideo.models.flux import FluxFolderError

    with pytest.raises(FluxFolderError, match="does not exist"):
        run(tmp_path / "no_model", tmp_path)


def test_module_entry_point_and_dry_run():
    env = {**os.environ, "FASTVIDEO_DEVICE": "cpu"}
    helped = subprocess.run(
        [sys.executable, "-m", "fastvideo.data_preprocess.preprocess_embeddings", "--help"],
        env=env, capture_output=True, text=True, timeout=120,
    )
    assert helped.returncode == 0 and "--prompt_dir" in helped.stdout and "--dataloader_num_workers" in helped.stdout
    assert parse_args([]).max_sequence_length == 512 and parse_args([]).max_prompts == 50000
    env.pop("MASTER_PORT", None)
    env.pop("NPROC", None)
    dry = subprocess.run(["bash", str(LAUNCHER)], env={**env, "DRY_RUN": "1", "MAX_SEQ_LEN": "77"},
                         capture_output=True, text=True, timeout=60)
    assert dry.returncode == 0, dry.stderr
    assert "--standalone --nproc_per_node=2 fastvideo/data_preprocess/preprocess_embeddings.py" in dry.stdout
    assert "--model_path data/flux --prompt_dir assets/prompts.txt --output_dir data/rl_embeddings" in dry.stdout
    assert "--max_sequence_length 77" in dry.stdout
    dry = subprocess.run(["bash", str(LAUNCHER), "--max_prompts", "10"],
                         env={**env, "DRY_RUN": "1", "MASTER_PORT": "29555", "NPROC": "3"},
                         capture_output=True, text=True, timeout=60)
    assert "--nnodes=1 --master_addr=127.0.0.1 --master_port=29555 --nproc_per_node=3" in dry.stdout
    assert dry.stdout.rstrip().endswith("--max_prompts 10")


def _zeros_record():
    return {"prompt_embeds": torch.zeros(4, 2), "pooled": torch.zeros(2), "text_ids": torch.zeros(4, 3)}


def test_prepare_output_keeps_trusted_files_only(tmp_path):
    from fastvideo.data_preprocess.embeddings import prepare_output, save_prompt_record, write_caption_json

    settings = {"model_path": "m", "max_sequence_length": 4}
    assert prepare_output(tmp_path, settings, ["a", "b", "c"], family=FLUX) == 0
    for i in range(3):
        save_prompt_record(tmp_path, i, _zeros_record(), family=FLUX)
    write_caption_json(tmp_path, ["a", "b", "c"], family=FLUX)
    (tmp_path / "prompt_embed" / ".0.pt.123.tmp").write_bytes(b"half")  # a killed writer's leftover
    mine = [".draft.tmp", ".0.pt.tmp", ".notes.pt.9.tmp", ".0.pt.12.tmp.bak"]  # a user's files (#39 item 19)
    for name in mine:
        (tmp_path / "prompt_embed" / name).write_bytes(b"keep me")
    assert prepare_output(tmp_path, settings, ["a", "b", "c"], family=FLUX) == 0  # same run: all kept
    assert (tmp_path / "videos2caption.json").is_file()
    assert not (tmp_path / "prompt_embed" / ".0.pt.123.tmp").exists()
    assert all((tmp_path / "prompt_embed" / name).read_bytes() == b"keep me" for name in mine)
    assert prepare_output(tmp_path, settings, ["a"], family=FLUX) == 0  # a capped run keeps the others' files ...
    assert (tmp_path / "prompt_embed" / "2.pt").exists()
    # ... and their captions, for a full run
    assert prepare_output(tmp_path, settings, ["a", "b", "c"], family=FLUX) == 0
    with pytest.raises(ConfigError, match="captions differ"):
        prepare_output(tmp_path, settings, ["a", "B", "c", "d"], family=FLUX)
    assert (tmp_path / "prompt_embed" / "1.pt").exists()
    assert prepare_output(tmp_path, settings, ["a", "B", "c", "d"], overwrite=True, family=FLUX) == 1  # caption 1 new
    assert not (tmp_path / "prompt_embed" / "1.pt").exists() and (tmp_path / "prompt_embed" / "2.pt").exists()
    assert not (tmp_path / "videos2caption.json").exists(), "an index of other prompts must go"
    with pytest.raises(ConfigError, match=r"other settings \(differing: max_sequence_length\)"):
        prepare_output(tmp_path, {**settings, "max_sequence_length": 8}, ["a", "B", "c", "d"], family=FLUX)
    assert prepare_output(tmp_path, {**settings, "max_sequence_length": 8}, ["a", "B", "c", "d"], overwrite=True,
                          family=FLUX) == 2
    assert not list((tmp_path / "prompt_embed").glob("*.pt"))
    (tmp_path / "preprocess_meta.json").unlink()
    save_prompt_record(tmp_path, 0, _zeros_record(), family=FLUX)
    # Files of unknown origin (upstream's folders have no meta): shape-checked, left as they are.
    with pytest.raises(ConfigError, match=r"no preprocess_meta.json .*all pass the shape check, flux dims \(4, 2, 2\)"
                                          r".*--data_json_path"):
        prepare_output(tmp_path, settings, ["a"], family=FLUX)
    torch.save(torch.zeros(2, 2), tmp_path / "pooled_prompt_embeds" / "0.pt")
    with pytest.raises(ConfigError, match=r"prompt 0's files do not pass the shape check"):
        prepare_output(tmp_path, settings, ["a"], family=FLUX)
    assert (tmp_path / "prompt_embed" / "0.pt").exists()
    assert prepare_output(tmp_path, settings, ["a"], overwrite=True, family=FLUX) == 1


def test_tensor_writes_are_atomic(tmp_path, monkeypatch):
    from fastvideo.data_preprocess import embeddings

    target = tmp_path / "0.pt"
    embeddings.atomic_torch_save(torch.ones(2), target)
    real_save = torch.save

    def dying_save(obj, path):
        Path(path).write_bytes(b"half a file")
        raise KeyboardInterrupt  # killed mid-write

    monkeypatch.setattr(embeddings.torch, "save", dying_save)
    with pytest.raises(KeyboardInterrupt):
        embeddings.atomic_torch_save(torch.zeros(2), target)
    monkeypatch.setattr(embeddings.torch, "save", real_save)
    assert torch.equal(torch.load(target, weights_only=True), torch.ones(2)), "old content intact"
    assert [p.name for p in tmp_path.iterdir()] == ["0.pt"], "no temporary file left behind"


def test_dancegrpo_script_name_still_runs_the_same_entry_point():
    """DanceGRPO's launch lines call preprocess_flux_embedding.py: the alias is the same CLI."""
    from fastvideo.data_preprocess import preprocess_embeddings, preprocess_flux_embedding

    assert preprocess_flux_embedding.cli is preprocess_embeddings.cli
    out = subprocess.run([sys.executable, str(REPO / "fastvideo" / "data_preprocess" / "preprocess_flux_embedding.py"),
                          "--help"], capture_output=True, text=True, timeout=120, cwd=REPO)
    assert out.returncode == 0 and "--model_family" in out.stdout


def test_the_family_is_read_from_the_folders_model_index(tiny_flux_dir, tiny_sd3_dir, tmp_path):
    """#39 item 8: an SD3 folder preprocessed without --model_family took FLUX's T5 tokenizer and died;
    the family comes from model_index.json (its transformer class), a contradicting flag is refused."""
    import json
    import shutil

    from fastvideo.errors import ConfigError
    from fastvideo.models.registry import family_of_folder

    assert parse_args(["--model_path", str(tiny_sd3_dir)]).model_family == "sd3"
    assert parse_args(["--model_path", str(tiny_flux_dir)]).model_family == "flux"
    assert parse_args(["--model_path", str(tmp_path / "none")]).model_family == "flux"  # nothing to read: the default
    assert json.loads((tiny_sd3_dir / "model_index.json").read_text())["_class_name"] == "StableDiffusion3Pipeline"
    with pytest.raises(ConfigError, match="holds a sd3 model .* pass --model_family sd3"):
        parse_args(["--model_path", str(tiny_sd3_dir), "--model_family", "flux"]).validate()
    other = tmp_path / "other"
    other.mkdir()
    shutil.copy(tiny_sd3_dir / "model_index.json", other / "model_index.json")
    index = json.loads((other / "model_index.json").read_text())
    (other / "model_index.json").write_text(json.dumps({**index, "transformer": ["diffusers", "UNet2DModel"]}))
    with pytest.raises(ConfigError, match="'StableDiffusion3Pipeline' .*'UNet2DModel'.* pass --model_family"):
        family_of_folder(other)
