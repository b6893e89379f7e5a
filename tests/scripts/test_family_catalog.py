"""The family catalog (fastvideo/models/catalog.py): one line a family wires its tiny builder, the CPU
demo (scripts/demo/grpo_tiny_cpu.sh MODEL=NAME) and the preprocessing launcher
(scripts/preprocess/preprocess_NAME_rl_embeddings.sh); the registry names the same families."""

from __future__ import annotations

import importlib
import os
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from fastvideo.models import catalog

ROOT = Path(__file__).resolve().parents[2]


def test_the_catalog_and_the_registry_name_the_same_families_in_the_same_order():
    from fastvideo.models.registry import DEFAULT_FAMILY, builtin_families

    assert catalog.names() == list(builtin_families())
    assert catalog.DEFAULT == DEFAULT_FAMILY == catalog.names()[0]


@pytest.mark.parametrize("name", catalog.names())
def test_each_line_names_a_builder_and_a_preprocessing_launcher_that_exist(name):
    w = catalog.wiring(name)
    builder = importlib.import_module(w.builder[0])
    # a family on another's checkpoint (flux2_edit: klein's) builds that one's tiny folder
    assert callable(builder.main) and callable(getattr(builder, f"make_tiny_{w.model or name}"))
    assert (ROOT / "scripts" / "preprocess" / f"preprocess_{name}_rl_embeddings.sh").is_file()


def _dry_run(env: dict) -> subprocess.CompletedProcess:
    base = {"DRY_RUN": "1", "PATH": "/usr/bin:/bin", "PYTHON": sys.executable, "HOME": os.environ.get("HOME", "/root")}
    return subprocess.run(["bash", str(ROOT / "scripts/demo/grpo_tiny_cpu.sh")], capture_output=True, text=True,
                          env={**base, **env}, cwd=ROOT, timeout=300)


def _runs_here(name: str) -> bool:
    from fastvideo.library_lines import library_line
    from fastvideo.models.registry import builtin_families

    return getattr(builtin_families()[name], "library_line", None) in (None, library_line())


@pytest.mark.parametrize("name", catalog.names())
def test_the_demo_trains_each_family_on_its_tiny_folder_with_its_flags(name):
    from fastvideo.config import build_parser, validate_args

    out = _dry_run({"MODEL": name, "DEMO_DIR": "/d x"})
    assert out.returncode == 0, out.stderr
    words = shlex.split(out.stdout.strip().splitlines()[-1])
    argv = words[words.index("fastvideo/train_grpo_flux.py") + 1:]
    assert argv[argv.index("--pretrained_model_name_or_path") + 1] == f"/d x/tiny_{name}"
    if name != "flux":
        assert argv[argv.index("--model_family") + 1] == name
    if _runs_here(name):  # the parser builds the family (refused on the other library line)
        cfg = validate_args(build_parser(argv).parse_args(argv))  # argv: a family's own flags (wan's)
        assert cfg.model.family == name and cfg.model.pretrained_model_name_or_path == f"/d x/tiny_{name}"
        # every demo saves samples (a video family's as MP4 clips) and evaluates with the guard
        assert cfg.output.save_images_every == 10 and cfg.eval.every == 10 and cfg.eval.guard.reward == "detail"
    suffix = "" if name == "flux" else f"_{name}"
    assert argv[argv.index("--output_dir") + 1] == f"/d x/outputs{suffix}"
    assert argv[argv.index("--data_json_path") + 1] == f"/d x/embeddings{suffix}/videos2caption.json"
    w = catalog.wiring(name)
    assert w.current_line == (name not in ("flux", "sd3", "hunyuan_video"))  # the demo runs these on the current line only


@pytest.mark.parametrize("name", ["flux", "sd3"])
def test_each_library_line_demos_into_its_own_folders(name):
    """LINE=current on a family both lines run: its own tiny model, embeddings and outputs (its
    --overwrite must not clear the recipe line's run; issue #50 item 9)."""
    runs = {line: _dry_run({"MODEL": name, "DEMO_DIR": "/d", "LINE": line}) for line in ("recipe", "current")}
    argv = {}
    for line, out in runs.items():
        assert out.returncode == 0, out.stderr
        words = shlex.split(out.stdout.strip().splitlines()[-1])
        argv[line] = words[words.index("fastvideo/train_grpo_flux.py") + 1:]
    suffix = "" if name == "flux" else f"_{name}"
    for flag, folder in (("--output_dir", f"/d/outputs{suffix}"), ("--pretrained_model_name_or_path", f"/d/tiny_{name}"),
                         ("--data_json_path", f"/d/embeddings{suffix}")):
        recipe, current = (argv[line][argv[line].index(flag) + 1] for line in ("recipe", "current"))
        assert recipe.startswith(folder) and current.startswith(f"{folder}_current") and recipe != current, flag


def test_the_demo_refuses_an_unknown_model_and_a_current_family_on_the_recipe_line():
    bad = _dry_run({"MODEL": "sd4"})
    assert bad.returncode == 2 and bad.stderr.strip().splitlines() == [
        "MODEL=sd4: use flux, sd3, flux2, zimage, qwen_image, kontext, qwen_image_edit, flux2_edit, wan, hunyuan_video or wan_i2v"]
    line = _dry_run({"MODEL": "zimage", "LINE": "recipe"})
    assert line.returncode == 2 and "MODEL=zimage runs on the current library line" in line.stderr


def test_demo_arguments_read_the_environment_and_the_demo_folder():
    w = catalog.wiring("qwen_image_edit")
    lines = catalog.demo_lines(w, "/demo", environ={"QWEN_IMAGE_LR": "5e-3"})
    family = shlex.split(next(x for x in lines if x.startswith("FAMILY_ARGS="))[len("FAMILY_ARGS=("):-1])
    assert family[family.index("--learning_rate") + 1] == "5e-3"
    assert family[family.index("--clip_dir") + 1] == "/demo/tiny_rewards/pickscore"
    assert "export SOURCE_VAE_SIZE=64" in lines and "PROMPTS=assets/edit/prompts_edit.jsonl" in lines
    assert "export SOURCE_VAE_SIZE=256" in catalog.demo_lines(w, "/demo", environ={"SOURCE_VAE_SIZE": "256"})
    empty = catalog.demo_lines(catalog.wiring("zimage"), "/demo", environ={"ZIMAGE_LR": ""})  # as ${ZIMAGE_LR:-1e-2}
    assert "--learning_rate 1e-2" in next(x for x in empty if x.startswith("FAMILY_ARGS="))


def test_the_builder_stamp_follows_every_builder_module(tmp_path):
    tools = tmp_path / "fastvideo" / "tools"
    tools.mkdir(parents=True)
    (tools / "make_tiny_a.py").write_text("A = 1\n")
    (tools / "tiny_builder.py").write_text("B = 1\n")
    (tools / "other.py").write_text("C = 1\n")
    first = catalog.builder_stamp(tmp_path)
    (tools / "other.py").write_text("C = 2\n")
    assert catalog.builder_stamp(tmp_path) == first and len(first) == 16
    (tools / "tiny_builder.py").write_text("B = 2\n")  # the shared base changes every family's folder
    assert catalog.builder_stamp(tmp_path) != first


@pytest.mark.parametrize("name", catalog.names())
def test_each_preprocessing_launcher_encodes_with_its_family_and_defaults(name):
    from fastvideo.data_preprocess.preprocess_embeddings import parse_args

    env = {"DRY_RUN": "1", "FASTVIDEO_DEVICE": "cpu", "PATH": "/usr/bin:/bin", "PYTHON": sys.executable,
           "HOME": os.environ.get("HOME", "/root"), "NPROC": "1"}
    script = ROOT / "scripts" / "preprocess" / f"preprocess_{name}_rl_embeddings.sh"
    out = subprocess.run(["bash", str(script)], capture_output=True, text=True, env=env, cwd=ROOT, timeout=300)
    assert out.returncode == 0, out.stderr
    words = shlex.split(out.stdout.strip().splitlines()[-1])
    argv = words[words.index("fastvideo/data_preprocess/preprocess_embeddings.py") + 1:]
    flags = dict(zip(argv[::2], argv[1::2]))
    suffix = "" if name == "flux" else f"_{name}"
    w = catalog.wiring(name)
    assert flags.get("--model_family", "flux") == name and flags["--model_path"] == f"data/{w.model or name}"
    assert flags["--output_dir"] == f"data/rl_embeddings{suffix}"
    assert flags["--max_sequence_length"] == str({"sd3": 128, "hunyuan_video": 256}.get(name, 512))
    edit = name in ("kontext", "qwen_image_edit", "flux2_edit", "wan_i2v")  # wan_i2v: first frames
    assert flags["--prompt_dir"] == ("assets/edit/prompts_edit.jsonl" if edit else "assets/prompts.txt")
    if name == "qwen_image_edit":  # Flow-Factory's condition_image_size [384, 384]
        assert flags["--source_vae_size"] == "384"
    if _runs_here(name):
        assert parse_args(argv).model_family == name
