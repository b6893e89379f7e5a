"""python -m fastvideo.tools.evaluate on the tiny base model and a checkpoint of a tiny run."""

from __future__ import annotations

import csv

import pytest

from helpers import read_metrics, train_args
from fastvideo.eval.report import read_jsonl
from fastvideo.tools.evaluate import main


def _tool_args(prompts, out, *models, **extra):
    argv = [a for m in models for a in ("--model", str(m))]
    argv += ["--prompts", str(prompts), "--rewards", "compressibility,detail,saturation", "--out", str(out),
             "--h", "32", "--w", "32", "--steps", "4", "--shift", "3", "--seed", "7",
             "--num_images_per_prompt", "2", "--batch_size", "4", "--max_sequence_length", "32",
             "--grid_prompts", "4"]
    for k, v in extra.items():
        argv += [f"--{k}", str(v)]
    return argv


def test_base_and_checkpoint_reproduce_the_training_evaluation(tiny_flux_dir, tiny_embeddings, eval_prompt_file,
                                                               tmp_path, monkeypatch, capsys):
    from fastvideo.train_grpo_flux import main as train

    import time

    import fastvideo.eval.core as core

    real = core.sample_images

    def slow_sample_images(*args, **kwargs):  # makes evaluation time stand out from iteration time
        time.sleep(2.5)
        return real(*args, **kwargs)

    monkeypatch.setattr(core, "sample_images", slow_sample_images)
    for k in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"):
        monkeypatch.delenv(k, raising=False)
    run = tmp_path / "run"
    argv = train_args(tiny_embeddings, tiny_flux_dir, run, save_images_every=0, eval_every=2,
                      eval_prompts=str(eval_prompt_file), eval_rewards="detail,saturation",
                      eval_num_images_per_prompt=2, eval_batch_size=4, max_train_steps=2, checkpointing_steps=2)
    assert train(argv) == 0
    capsys.readouterr()
    # Evaluation time is recorded in eval.jsonl and is not part of the iterations' times.
    assert all(r["time_eval"] >= 7.5 for r in read_jsonl(run / "eval.jsonl"))  # 12 images in 3 batches
    # An iteration of the tiny model takes well under a second on an idle 2-core CPU; an iteration that
    # counted the evaluation in would take at least the evaluation's own time (>= 7.5 s, above).
    evals = min(r["time_eval"] for r in read_jsonl(run / "eval.jsonl"))
    assert all(r["time_iteration"] < evals for r in read_metrics(run))
    monkeypatch.setattr(core, "sample_images", real)
    # The checkpoint alone: the run's config.json gives size, steps, eta, shift, seed, batch, images per
    # prompt, T5 length, prompts, rewards and the base folder; the scores are eval.jsonl's, bit for bit.
    own = tmp_path / "own"
    assert main(["--model", str(run / "checkpoint-2"), "--out", str(own)]) == 0
    printed = capsys.readouterr().out
    assert f"defaults from {run / 'config.json'}: h 32, w 32" in printed and "seed 7" in printed
    recorded = {r["iteration"]: r["rewards"] for r in read_jsonl(run / "eval.jsonl")}
    mine = {r["reward"]: float(r["mean"]) for r in csv.DictReader(open(own / "results.csv"))}
    assert mine == {n: v["mean"] for n, v in recorded[2].items()}
    per_prompt = {}
    for rec in read_jsonl(own / "scores.jsonl"):
        per_prompt.setdefault(rec["prompt"], []).append(rec["scores"]["detail"])
    assert [round(sum(v) / len(v), 6) for v in per_prompt.values()] == recorded[2]["detail"]["per_prompt"]
    # A flag given still wins over the run's value.
    assert main(["--model", str(run / "checkpoint-2"), "--out", str(tmp_path / "s2"), "--steps", "2",
                 "--rewards", "detail", "--grid_prompts", "4"]) == 0
    capsys.readouterr()
    other = {r["reward"]: float(r["mean"]) for r in csv.DictReader(open(tmp_path / "s2" / "results.csv"))}
    assert list(other) == ["detail"] and other["detail"] != mine["detail"]
    out = tmp_path / "cmp"
    assert main(_tool_args(eval_prompt_file, out, f"base={tiny_flux_dir}", f"tuned={run / 'checkpoint-2'}")) == 0
    printed = capsys.readouterr().out
    assert ("| model | reward | mean | std | 95% CI | win rate vs base | n | difference vs base [95% t-CI, paired "
            "by prompt] |") in printed
    assert "| tuned | detail |" in printed
    rows = list(csv.DictReader(open(out / "results.csv")))
    assert [(r["model"], r["reward"]) for r in rows][:4] == [("base", "compressibility"), ("base", "detail"),
                                                             ("base", "saturation"), ("tuned", "compressibility")]
    assert all(r["n"] == "12" for r in rows)
    # Same noise, same sampler: the checkpoint scores what the run's evaluation recorded.
    for label, it in (("base", 0), ("tuned", 2)):
        for r in (r for r in rows if r["model"] == label):
            assert float(r["mean"]) == pytest.approx(recorded[it][r["reward"]]["mean"], rel=1e-6, abs=1e-9)
    scores = read_jsonl(out / "scores.jsonl")
    assert len(scores) == 2 * 6 * 2
    for name in ("grid_00.png", "grid_01.png", "results.md"):
        assert (out / name).stat().st_size > 200, name


def test_lora_checkpoint_and_its_export_evaluate_alike(tiny_flux_dir, tiny_embeddings, eval_prompt_file, tmp_path,
                                                       monkeypatch, capsys):
    """A LoRA run's checkpoint and its exported pytorch_lora_weights.safetensors (on the base) are the
    same model: equal scores on the same noise, and different from the base's."""
    from fastvideo.tools.export import main as export
    from fastvideo.train_grpo_flux import main as train

    for k in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"):
        monkeypatch.delenv(k, raising=False)
    run = tmp_path / "lora_run"
    argv = train_args(tiny_embeddings, tiny_flux_dir, run, save_images_every=0, max_train_steps=1,
                      checkpointing_steps=1, use_lora=True, lora_rank=4, lora_alpha=8, learning_rate=3e-2,
                      fsdp_sharding_strategy="none")
    assert train(argv) == 0
    export([str(run / "checkpoint-1"), str(tmp_path / "exported"), "--lora"])
    out = tmp_path / "cmp"
    assert main(_tool_args(eval_prompt_file, out, f"base={tiny_flux_dir}", f"ckpt={run / 'checkpoint-1'}",
                           f"file={tmp_path / 'exported'}")) == 0
    capsys.readouterr()
    means = {(r["model"], r["reward"]): float(r["mean"]) for r in csv.DictReader(open(out / "results.csv"))}
    for reward in ("compressibility", "detail", "saturation"):
        assert means[("file", reward)] == pytest.approx(means[("ckpt", reward)], rel=1e-5, abs=1e-7)
    assert any(means[("ckpt", r)] != means[("base", r)] for r in ("compressibility", "detail", "saturation"))


def test_unknown_models_fail_clearly(tiny_flux_dir, eval_prompt_file, tmp_path, capsys):
    peft_folder = tmp_path / "my_lora"
    peft_folder.mkdir()
    (peft_folder / "adapter_config.json").write_text("{}")
    with pytest.raises(SystemExit) as exc:
        main(_tool_args(eval_prompt_file, tmp_path / "o", tiny_flux_dir, peft_folder))
    assert exc.value.code == 2
    assert "export the run's LoRA" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(_tool_args(eval_prompt_file, tmp_path / "o", tmp_path))
    assert "neither a FLUX folder" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(_tool_args(eval_prompt_file, tmp_path / "o", tiny_flux_dir, rewards="nope"))
    assert "unknown reward 'nope'" in capsys.readouterr().err
    with pytest.raises(SystemExit) as exc:  # a flag only a video family takes
        main(_tool_args(eval_prompt_file, tmp_path / "o", tiny_flux_dir) + ["--num_frames", "5"])
    assert exc.value.code == 2 and "unrecognized arguments: --num_frames 5" in capsys.readouterr().err


def test_a_base_model_alone_names_every_missing_input_at_once(tiny_flux_dir, tmp_path, capsys):
    """A diffusers folder has no run to default from: --prompts and --rewards are named in one line."""
    with pytest.raises(SystemExit) as exc:
        main(["--model", str(tiny_flux_dir), "--out", str(tmp_path / "o")])
    err = capsys.readouterr().err
    assert exc.value.code == 2 and len(err.strip().splitlines()) == 1
    assert "--prompts and --rewards needed" in err and "--rewards hpsv2,detail" in err
    with pytest.raises(SystemExit):
        main(["--model", str(tiny_flux_dir), "--out", str(tmp_path / "o"), "--rewards", "detail"])
    err = capsys.readouterr().err
    assert "--prompts needed" in err and "--rewards" not in err.split("needed")[0]


def test_an_explicit_model_family_scores_the_same(tiny_flux_dir, eval_prompt_file, tmp_path, capsys):
    assert main(_tool_args(eval_prompt_file, tmp_path / "a", f"base={tiny_flux_dir}")) == 0
    assert main(_tool_args(eval_prompt_file, tmp_path / "b", f"base={tiny_flux_dir}", model_family="flux")) == 0
    capsys.readouterr()
    assert (tmp_path / "a" / "scores.jsonl").read_text() == (tmp_path / "b" / "scores.jsonl").read_text()


def test_an_unknown_or_contradicting_model_family_fails_clearly(tiny_flux_dir, eval_prompt_file, tmp_path, capsys):
    import json

    with pytest.raises(SystemExit) as exc:
        main(_tool_args(eval_prompt_file, tmp_path / "o", tiny_flux_dir, model_family="nope"))
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "unknown model family 'nope'" in err and "valid: flux" in err
    # a checkpoint whose run was FLUX, evaluated as another family: refused before anything loads
    ckpt = tmp_path / "run" / "checkpoint-1"
    ckpt.mkdir(parents=True)
    (ckpt / "model.safetensors").write_bytes(b"")
    (ckpt / "COMPLETE.json").write_text("{}")
    (tmp_path / "run" / "config.json").write_text(json.dumps({"model": {"family": "flux"}, "rollout": {}}))
    with pytest.raises(SystemExit) as exc:
        main(_tool_args(eval_prompt_file, tmp_path / "o", tiny_flux_dir, ckpt, model_family="toy_family:ToyFamily"))
    assert exc.value.code == 2 and "different families (flux, toy_family:ToyFamily" in capsys.readouterr().err


def test_run_defaults_fill_only_the_flags_not_given(tmp_path):
    """config.json's values (rollout, seed, eval section, reward folders) become the defaults; a flag
    given keeps its value; a second run that differs is named; no run: the built-in defaults."""
    import json

    from fastvideo.eval.run_defaults import BUILTIN, resolve
    from fastvideo.tools.evaluate import build_parser

    def run_dir(name, seed, eval_section):
        (tmp_path / name / "checkpoint-4").mkdir(parents=True)
        config = {"data_json_path": str(tmp_path / "gone.json"),
                  "model": {"family": "flux", "mixed_precision": "no", "pretrained_model_name_or_path": "m"},
                  "rollout": {"height": 64, "width": 48, "shift": 2.5, "guidance_scale": 1.0, "quantize_timestep": False,
                              "sampling_steps": 6, "rollout_batch_size": 3},
                  "optim": {"seed": seed}, "reward": {"hps_ckpt_dir": "h", "hps_input": "float", "batch_size": 5},
                  "eval": eval_section}
        (tmp_path / name / "config.json").write_text(json.dumps(config))
        return tmp_path / name / "checkpoint-4"

    section = {"steps": 5, "eta": 0.25, "batch_size": 4, "num_images_per_prompt": 2, "grid_prompts": 3,
               "prompts": "p.txt", "rewards": ["compressibility", "detail"], "max_sequence_length": 24}
    first, second = run_dir("a", 7, section), run_dir("b", 8, None)
    args = build_parser().parse_args(["--model", "x", "--out", "o", "--steps", "9"])
    lines, run = resolve(args, [first, second])
    assert run["optim"]["seed"] == 7 and lines[0].startswith(f"[evaluate] defaults from {tmp_path / 'a' / 'config.json'}")
    assert "b/config.json differs on seed, " in lines[1]
    got = {k: getattr(args, k) for k in BUILTIN}
    assert got == {**BUILTIN, "h": 64, "w": 48, "shift": 2.5, "guidance_scale": 1.0, "no_quantize_timestep": True,
                   "seed": 7, "steps": 9, "eta": 0.25, "batch_size": 4, "num_images_per_prompt": 2, "grid_prompts": 3,
                   "max_sequence_length": 24, "mixed_precision": "no", "hps_ckpt_dir": "h", "hps_input": "float",
                   "reward_batch_size": 5, "prompts": "p.txt", "rewards": "compressibility,detail"}
    # a run without evaluation: its rollout's steps and batch; its embeddings are gone: T5 length built in
    args = build_parser().parse_args(["--model", "x", "--out", "o"])
    resolve(args, [second])
    assert (args.steps, args.batch_size, args.eta, args.max_sequence_length, args.prompts) == (6, 3, 0.0, 512, None)
    args = build_parser().parse_args(["--model", "x", "--out", "o"])
    assert resolve(args, [tmp_path]) == ([], None) and {k: getattr(args, k) for k in BUILTIN} == BUILTIN
