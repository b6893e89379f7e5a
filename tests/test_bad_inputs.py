"""The exit-2-one-line contract, table-driven: every bad input below, across the seven entry points
(train, preprocess, evaluate, export, compare_runs, reward_server, cost_model), exits 2 with ONE
line on stderr and no traceback.

The cases run in this process through each entry point's own ``main`` (the real path: parsing,
checks, then the work, which none of them reaches); a few run as real subprocesses to hold the
command line itself to the contract. A case is (entry point, argv builder, a word the line must hold).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent / "training"))
from helpers import ROOT, train_args  # noqa: E402

NAN, INF = "nan", "inf"


class _NeedsSources:
    """A reward the stand-in server serves: it compares each image with its source image."""

    uses_sources = True

    def __call__(self, images, prompts, sources=None):
        return (images - sources).abs().mean(dim=(1, 2, 3))


@pytest.fixture(scope="module")
def source_server():
    """The project's reward server whose /health says its reward uses source images (#36)."""
    from fastvideo.tools.reward_server import PluginReward, build_app, served_info
    from server_utils import serve_in_thread

    reward = PluginReward("edit", _NeedsSources(), 2)
    with serve_in_thread(build_app({"edit": reward}, {"edit": served_info("edit", reward, {})})) as (url, _):
        yield url


@pytest.fixture(scope="module")
def env(tiny_flux_dir, tiny_embeddings, tmp_path_factory, source_server):
    """Paths the builders use: the tiny model and embeddings, a file, an empty folder, a
    checkpoint-like folder without its marker, a prompts file shared with training."""
    root = tmp_path_factory.mktemp("bad_inputs")
    a_file = root / "a_file.txt"
    a_file.write_text("not a folder\n")
    empty = root / "empty"
    empty.mkdir()
    incomplete = root / "checkpoint-3"
    incomplete.mkdir()
    (incomplete / "model.safetensors").write_bytes(b"\0" * 16)
    train_prompts = root / "train_prompts.txt"
    captions = [e["caption"] for e in json.loads(Path(tiny_embeddings).read_text())]
    train_prompts.write_text("\n".join(captions[:3]) + "\n")
    empty_prompts = root / "empty_prompts.txt"
    empty_prompts.write_text("\n\n")
    mixed = root / "mixed_model"  # one more block in the config than in the weights
    shutil.copytree(tiny_flux_dir, mixed)
    cfg = json.loads((mixed / "transformer" / "config.json").read_text())
    (mixed / "transformer" / "config.json").write_text(json.dumps({**cfg, "num_layers": cfg["num_layers"] + 1}))
    models = {name: _broken_model(tiny_flux_dir, root / name, name) for name in BROKEN_MODELS}
    data = {name: _broken_data(Path(tiny_embeddings), root / name, name) for name in BROKEN_DATA}
    binary = root / "binary.yaml"
    binary.write_bytes(bytes(range(256)) * 4)
    read_only = root / "read_only"
    read_only.mkdir()
    read_only.chmod(0o555)
    return dict(model=str(tiny_flux_dir), emb=str(tiny_embeddings), root=root, file=str(a_file), empty=str(empty),
                incomplete=str(incomplete), train_prompts=str(train_prompts), empty_prompts=str(empty_prompts),
                mixed_model=str(mixed), read_only=str(read_only), binary=str(binary), source_server=source_server,
                **{k: str(v) for k, v in {**models, **data}.items()})


def _edit_json(path, **changes):
    path.write_text(json.dumps({**json.loads(path.read_text()), **changes}))


def _cut(path, keep):
    with open(path, "r+b") as f:
        f.truncate(keep if keep > 0 else path.stat().st_size + keep)


def _overwrite_header(path):
    data = bytearray(path.read_bytes())
    data[8:40] = b"x" * 32
    path.write_bytes(bytes(data))


# A copy of the tiny model with one thing broken: name -> what is done to the copy (#39 item 15)
BROKEN_MODELS = {
    "cfg_not_json": lambda d: (d / "transformer" / "config.json").write_text("{not json"),
    "cfg_wrong_type": lambda d: _edit_json(d / "transformer" / "config.json", num_layers="one"),
    "weights_cut": lambda d: _cut(d / "transformer" / "diffusion_pytorch_model.safetensors", -100),
    "weights_cut_in_header": lambda d: _cut(d / "transformer" / "diffusion_pytorch_model.safetensors", 1000),
    "header_overwritten": lambda d: _overwrite_header(d / "transformer" / "diffusion_pytorch_model.safetensors"),
    "vae_cfg_other_model": lambda d: _edit_json(d / "vae" / "config.json", latent_channels=32),
    # #39 item 8: a pipeline folder of no registered family (preprocessing reads the family from it)
    "index_other_pipeline": lambda d: _edit_json(d / "model_index.json", _class_name="KandinskyPipeline",
                                                 transformer=["diffusers", "UNet2DConditionModel"]),
    "index_not_json": lambda d: (d / "model_index.json").write_text("{not json"),
}


def _first_entry(index, **changes):
    entries = json.loads(index.read_text())
    index.write_text(json.dumps([{**entries[0], **changes}, *entries[1:]]))


def _save_tensor(path, shape):
    import torch

    torch.save(torch.zeros(shape), path)


# A copy of the tiny embeddings with one thing broken: name -> what is done to the copy's folder
BROKEN_DATA = {
    "index_entry_wrong_type": lambda d: _first_entry(d / "videos2caption.json", prompt_embed_path=7),
    "pt_wrong_shape": lambda d: _save_tensor(d / "prompt_embed" / "0.pt", (3, 3)),
}


def _broken_data(index, target, name):
    shutil.copytree(index.parent, target)
    BROKEN_DATA[name](target)
    return target / index.name


def _broken_model(source, target, name):
    shutil.copytree(source, target)
    BROKEN_MODELS[name](target)
    return target


def _t(needle, env=None, **flags):
    """A train case: the tiny run's flags with ``flags`` replaced (None removes one; "{name}" is filled
    in from the env fixture, e.g. a broken copy of the model); ``env``: environment variables to set."""
    flags = {"max_train_steps": 1, "save_images_every": 0, **flags}
    return ("train", lambda e: train_args(e["emb"], e["model"], e["root"] / "out", **flags), needle, env or {})


def _raw(entry, needle, *argv):
    """A case with literal argv; {model} {emb} {file} {empty} {incomplete} {root} ... are filled in."""
    return (entry, lambda e: [a.format(**e) for a in argv], needle, {})


TRAIN = [
    _t("learning_rate", learning_rate=-1e-5), _t("learning_rate", learning_rate=NAN),
    _t("learning_rate", learning_rate=INF), _t("learning_rate", learning_rate="-inf"),
    _t("weight_decay", weight_decay=-0.1), _t("weight_decay", weight_decay=NAN),
    _t("max_grad_norm", max_grad_norm=NAN), _t("shift", shift=0), _t("shift", shift=-2), _t("shift", shift=NAN),
    _t("eta", eta=INF), _t("eta", eta=NAN), _t("eta", eta=-0.3), _t("eta", eta=0),
    _t("guidance_scale", guidance_scale=NAN), _t("lr_warmup_steps", lr_warmup_steps=-1),
    _t("it is a module, not a family", model_family="os:path"),     _t("lr_scheduler", lr_scheduler="bogus"), _t("ema_decay", use_ema=True, ema_decay=1.5),
    _t("max_train_steps", max_train_steps=0), _t("max_nonfinite_steps", max_nonfinite_steps=0),
    _t("num_generations", num_generations=0), _t("sampling_steps", sampling_steps=0),
    _t("--bestofn 3", bestofn=3), _t("--bestofn 4", bestofn=4),
    _t("--h", h=0), _t("--h", w=-32), _t("multiples of 16", h=40),
    _t("train_batch_size", train_batch_size=0), _t("rollout_batch_size", rollout_batch_size=0),
    _t("train_micro_batch_size", train_micro_batch_size=0),
    _t("gradient_accumulation_steps", gradient_accumulation_steps=0),
    _t("timestep_fraction", timestep_fraction=0), _t("timestep_fraction", timestep_fraction=1.5),
    _t("checkpointing_steps", checkpointing_steps=0), _t("checkpoints_total_limit", checkpoints_total_limit=0),
    _t("--rewards", rewards=""), _t("not a number", rewards="compressibility:abc"),
    _t("finite", rewards="compressibility:inf"), _t("unknown reward", rewards="nope:1"),
    _t("all reward weights are zero", rewards="compressibility:0"),
    _t("appears twice", rewards="compressibility,compressibility"),
    _t("mixed_precision", mixed_precision="fp8"), _t("learning_rate", learning_rate="abc"),
    _t("unknown flag --no_such_flag", no_such_flag=True), _t("log_every", log_every=-1),
    _t("dump_randomness", dump_randomness=True, load_randomness=True),
    _t("is a file", output_dir="{file}"), _t("is a file", output_dir="{file}/sub"),
    _t("does not divide the world size 1", sp_size=2), _t("either with --rewards", use_hpsv2=True),
    _t("nope.json", data_json_path="{root}/nope.json"), _t("make_tiny_flux", pretrained_model_name_or_path="{empty}"),
    _t("no complete checkpoint", resume_from_checkpoint="latest"),
    _t("training prompts", eval_every=1, eval_prompts="{train_prompts}", eval_rewards="detail"),
    _t("config", config="{root}/nope.yaml"),
    _t("config.json and weights disagree", pretrained_model_name_or_path="{mixed_model}", fsdp_sharding_strategy="none"),
    _t("does not answer", rewards="remote:http://127.0.0.1:9/x:1"),  # nothing listens on port 9
    _t("is not valid JSON", pretrained_model_name_or_path="{cfg_not_json}"),
    _t("does not build a transformer", pretrained_model_name_or_path="{cfg_wrong_type}"),
    _t("cut short", pretrained_model_name_or_path="{weights_cut}"),
    _t("cut short", pretrained_model_name_or_path="{weights_cut_in_header}"),
    _t("safetensors header is damaged", pretrained_model_name_or_path="{header_overwritten}"),
    _t("config.json and weights disagree", pretrained_model_name_or_path="{vae_cfg_other_model}"),
    _t("where a string", data_json_path="{index_entry_wrong_type}"),
    _t("prompt 0", data_json_path="{pt_wrong_shape}"),
    _t("--seed", seed=2**70), _t("--sampler_seed", sampler_seed=-(2**64)),
    _t("not a text file", config="{binary}"),
    _t("'tpu' is not a device type", env={"FASTVIDEO_DEVICE": "tpu"}),
    _t("--lora_target_modules", use_lora=True, lora_target_modules="nope_a,nope_b"),
    _t("MASTER_ADDR and MASTER_PORT not set", env={"WORLD_SIZE": "2"}),
    pytest.param(*_t("not writable", output_dir="{read_only}/out"),
                 marks=pytest.mark.skipif(os.geteuid() == 0, reason="root writes into a read-only folder")),    _t("generates from text", rewards="remote:{source_server}/edit:1"),  # #36: /health says uses_sources
    _t("embedding_cache_mb", embedding_cache_mb=-1),  # the mutation tables name train cases by index: append below
    # a plain start (no launcher) refuses a size no host holds before allocating (#50 item 11: it grew to 16 GB)
    _t("the memory model puts what the rollout holds", h=1048576, w=1048576),
]

PREPROCESS = [
    _raw("preprocess", "max_sequence_length", "--model_path", "{model}", "--prompt_dir", "{train_prompts}",
         "--output_dir", "{root}/p", "--max_sequence_length", "0"),
    _raw("preprocess", "max_sequence_length", "--model_path", "{model}", "--output_dir", "{root}/p",
         "--max_sequence_length", "-4"),
    _raw("preprocess", "max_sequence_length", "--model_path", "{model}", "--max_sequence_length", "600"),
    _raw("preprocess", "max_sequence_length", "--max_sequence_length", "abc"),
    _raw("preprocess", "batch_size", "--model_path", "{model}", "--batch_size", "0"),
    _raw("preprocess", "batch_size", "--model_path", "{model}", "--batch_size", "-1"),
    _raw("preprocess", "max_prompts", "--model_path", "{model}", "--max_prompts", "0"),
    _raw("preprocess", "max_prompts", "--model_path", "{model}", "--max_prompts", "-5"),
    _raw("preprocess", "dataloader_num_workers", "--model_path", "{model}", "--dataloader_num_workers", "-1"),
    _raw("preprocess", "does not exist", "--model_path", "{model}", "--prompt_dir", "{root}/none.txt",
         "--output_dir", "{root}/p"),
    _raw("preprocess", "empty_prompts", "--model_path", "{model}", "--prompt_dir", "{empty_prompts}",
         "--output_dir", "{root}/p"),
    _raw("preprocess", "is a file", "--model_path", "{model}", "--prompt_dir", "{train_prompts}",
         "--output_dir", "{file}"),
    _raw("preprocess", "model family", "--model_path", "{model}", "--model_family", "nope"),
    _raw("preprocess", "it is a module, not a family", "--model_path", "{model}", "--model_family", "os:path"),
    _raw("preprocess", "KandinskyPipeline", "--model_path", "{index_other_pipeline}", "--output_dir", "{root}/p"),
    _raw("preprocess", "model index", "--model_path", "{index_not_json}", "--output_dir", "{root}/p"),
    _raw("preprocess", "holds a flux model", "--model_path", "{model}", "--model_family", "sd3",
         "--output_dir", "{root}/p"),
    _raw("preprocess", "unrecognized", "--no_such_flag"),
]

EVALUATE = [
    _raw("evaluate", "--model", "--prompts", "{train_prompts}", "--rewards", "detail", "--out", "{root}/e"),
    _raw("evaluate", "is not a folder", "--model", "{root}/nomodel", "--prompts", "{train_prompts}",
         "--rewards", "detail", "--out", "{root}/e"),
    _raw("evaluate", "none.txt", "--model", "{model}", "--prompts", "{root}/none.txt", "--rewards", "detail",
         "--out", "{root}/e"),
    _raw("evaluate", "unknown reward", "--model", "{model}", "--prompts", "{train_prompts}", "--rewards", "nope",
         "--out", "{root}/e"),
    _raw("evaluate", "steps", "--model", "{model}", "--prompts", "{train_prompts}", "--rewards", "detail",
         "--out", "{root}/e", "--steps", "0"),
    _raw("evaluate", "batch_size", "--model", "{model}", "--prompts", "{train_prompts}", "--rewards", "detail",
         "--out", "{root}/e", "--batch_size", "0"),
    _raw("evaluate", "num_images_per_prompt", "--model", "{model}", "--prompts", "{train_prompts}",
         "--rewards", "detail", "--out", "{root}/e", "--num_images_per_prompt", "0"),
    _raw("evaluate", "--h", "--model", "{model}", "--prompts", "{train_prompts}", "--rewards", "detail",
         "--out", "{root}/e", "--h", "0"),
    _raw("evaluate", "eta", "--model", "{model}", "--prompts", "{train_prompts}", "--rewards", "detail",
         "--out", "{root}/e", "--eta", "nan"),
    _raw("evaluate", "mixed_precision", "--model", "{model}", "--prompts", "{train_prompts}", "--rewards",
         "detail", "--out", "{root}/e", "--mixed_precision", "fp8"),
    _raw("evaluate", "is a file", "--model", "{model}", "--prompts", "{train_prompts}", "--rewards", "detail",
         "--out", "{file}"),
]

EXPORT = [
    _raw("export", "does not exist", "{root}/no_checkpoint", "{root}/x"),
    _raw("export", "two different exports", "{incomplete}", "{root}/x", "--lora", "--merge"),
    _raw("export", "adapters only", "{incomplete}", "{root}/x", "--lora", "--dtype", "bf16"),
    _raw("export", "dtype", "{incomplete}", "{root}/x", "--dtype", "fp8"),
    _raw("export", "COMPLETE", "{incomplete}", "{root}/x"),
    _raw("export", "a_file", "{file}", "{root}/x"),
    _raw("export", "checkpoint", "{empty}", "{root}/x"),
    _raw("export", "arguments are required"),
]

COMPARE_RUNS = [
    _raw("compare_runs", "--out", "{empty}", "{empty}"),
    _raw("compare_runs", "reward_tol", "{empty}", "{empty}", "--out", "{root}/c", "--reward_tol", "-1"),
    _raw("compare_runs", "max_iterations", "{empty}", "{empty}", "--out", "{root}/c", "--max_iterations", "0"),
    _raw("compare_runs", "reward_floor", "{empty}", "{empty}", "--out", "{root}/c", "--reward_floor", "0"),
    _raw("compare_runs", "layer_tol", "{empty}", "{empty}", "--out", "{root}/c", "--layer_tol", "garbage"),
    _raw("compare_runs", "nowhere", "{root}/nowhere", "{empty}", "--out", "{root}/c"),
    _raw("compare_runs", "a_file", "{file}", "{empty}", "--out", "{root}/c"),
    _raw("compare_runs", "empty", "{empty}", "{empty}", "--out", "{root}/c"),
    _raw("compare_runs", "reward_tol", "{empty}", "{empty}", "--out", "{root}/c", "--reward_tol", "nan"),
]

REWARD_SERVER = [
    _raw("reward_server", "unknown reward", "--rewards", "nope"),
    _raw("reward_server", "port", "--rewards", "detail", "--port", "-1"),
    _raw("reward_server", "port", "--rewards", "detail", "--port", "70000"),
    _raw("reward_server", "batch_size", "--rewards", "detail", "--batch_size", "0"),
    _raw("reward_server", "max_body_mb", "--rewards", "detail", "--max_body_mb", "0"),
    _raw("reward_server", "--token", "--rewards", "detail", "--host", "0.0.0.0"),
    _raw("reward_server", "plugin", "--rewards", "detail", "--plugin", "bad"),
    _raw("reward_server", "max_pixels", "--rewards", "detail", "--max_pixels", "0"),
    _raw("reward_server", "device", "--rewards", "detail", "--device", "tpu"),
    _raw("reward_server", "no_hps", "--rewards", "hpsv2", "--hps_ckpt_dir", "{root}/no_hps"),
    _raw("reward_server", "read_timeout_s", "--rewards", "detail", "--read_timeout_s", "nan"),
    _raw("reward_server", "max_request_pixels", "--rewards", "detail", "--max_request_pixels", "0"),
    _raw("reward_server", "would wait forever", "--rewards", "detail", "--max_server_pixels", "100"),
    _raw("reward_server", "could never be read", "--rewards", "detail", "--max_buffered_mb", "1"),
]

COST_MODEL = [
    _raw("cost_model", "model", "--model", "bogus"),
    _raw("cost_model", "--h", "--model", "tiny", "--h", "0"),
    _raw("cost_model", "sampling_steps", "--model", "tiny", "--sampling_steps", "0"),
    _raw("cost_model", "num_generations", "--model", "tiny", "--num_generations", "0"),
    _raw("cost_model", "timestep_fraction", "--model", "tiny", "--timestep_fraction", "2"),
    _raw("cost_model", "world_size", "--model", "tiny", "--world_size", "0"),
    _raw("cost_model", "model family", "--model_family", "nope"),
    _raw("cost_model", "is a class but not a ModelFamily", "--model_family", "collections:OrderedDict"),
    _raw("cost_model", "none", "--model", "{root}/none/config.json"),
    _raw("cost_model", "unknown reward", "--model", "tiny", "--rewards", "nope"),
    _raw("cost_model", "peak_tflops", "--model", "tiny", "--peak_tflops", "-1"),
]

CASES = TRAIN + PREPROCESS + EVALUATE + EXPORT + COMPARE_RUNS + REWARD_SERVER + COST_MODEL


def _main(entry: str):
    """The entry point's own main (argv -> exit status or SystemExit)."""
    if entry == "train":
        from fastvideo.train_grpo_flux import main
    elif entry == "preprocess":
        from fastvideo.data_preprocess.preprocess_flux_embedding import cli as main
    else:
        import importlib

        main = importlib.import_module(f"fastvideo.tools.{entry}").main
    return main


def _fill(argv, e):
    return [a.format(**e) if "{" in a else a for a in argv]


def _one_line(code, err):
    lines = [line for line in err.splitlines() if line.strip()]
    assert code == 2, err[-3000:]
    assert "Traceback" not in err, err[-3000:]
    assert len(lines) == 1, err[-3000:]
    return lines[0]


def test_the_table_has_over_100_cases_across_the_seven_entry_points():
    entries = {_entry(c) for c in CASES}
    assert len(CASES) >= 100 and entries == {"train", "preprocess", "evaluate", "export", "compare_runs",
                                              "reward_server", "cost_model"}


def _entry(case) -> str:
    return case.values[0] if hasattr(case, "values") else case[0]


@pytest.mark.parametrize("entry, argv, needle, environ", CASES, ids=[f"{_entry(c)}-{i}" for i, c in enumerate(CASES)])
def test_bad_input_exits_2_with_one_line(entry, argv, needle, environ, env, capsys, monkeypatch):
    for k in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", "FASTVIDEO_DEBUG"):
        monkeypatch.delenv(k, raising=False)
    monkeypatch.setenv("FLUX_GRPO_REWARD_TOKEN", "")
    for k, v in environ.items():
        monkeypatch.setenv(k, v)
    args = _fill(argv(env), env)
    capsys.readouterr()
    try:
        code = _main(entry)(args)
    except SystemExit as stop:
        code = stop.code
    line = _one_line(code, capsys.readouterr().err)
    assert needle in line, line


# (module, argv, environment, a word the line must hold); "{port}" is a free port, "{emb}" ... the env fixture's
SUBPROCESS = [
    ("fastvideo.train_grpo_flux", ["--data_json_path", "x.json", "--pretrained_model_name_or_path", "y",
                                   "--learning_rate", "nan"], {}, "error:"),
    ("fastvideo.data_preprocess.preprocess_flux_embedding", ["--max_prompts", "0"], {}, "max_prompts"),
    ("fastvideo.tools.reward_server", ["--rewards", "nope"], {}, "nope"),
    # one process told it has a peer that never comes: a line after the wait, not a silent 30-minute hang
    ("fastvideo.train_grpo_flux", ["{train}"], {"WORLD_SIZE": "2", "RANK": "0", "MASTER_ADDR": "127.0.0.1",
                                                "MASTER_PORT": "{port}", "FASTVIDEO_RENDEZVOUS_TIMEOUT_S": "2"},
     "did not join"),
]


@pytest.mark.parametrize("module, argv, environ, needle", SUBPROCESS,
                         ids=[f"{m.rsplit('.', 1)[-1]}-{i}" for i, (m, *_) in enumerate(SUBPROCESS)])
def test_the_command_line_itself_exits_2_with_one_line(module, argv, environ, needle, env, tmp_path):
    from server_utils import free_port

    if argv == ["{train}"]:
        argv = train_args(env["emb"], env["model"], tmp_path / "out", max_train_steps=1)
    environ = {k: v.format(port=free_port()) for k, v in environ.items()}
    proc = subprocess.run([sys.executable, "-m", module, *argv], capture_output=True, text=True, timeout=120,
                          cwd=tmp_path, env={**os.environ, "FASTVIDEO_DEVICE": "cpu", "PYTHONPATH": str(ROOT),
                                             **environ})
    assert needle in _one_line(proc.returncode, proc.stderr)
