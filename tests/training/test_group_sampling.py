"""Group sampling for every objective, and an objective's declared needs (issue 46, item 3).

--num_generations G draws G samples per prompt whatever the objective; GRPO (and NFT, which shares
its grouping) keeps upstream DanceGRPO's one sample per prompt without --use_group. A plugin
objective written outside fastvideo/ (here into tmp_path) trains on groups without --use_group.
GRPO's flags given to another objective get one start-up note. The memory estimates ask the
objective what it keeps (an old policy, a reference model, the step latents) instead of its name.
"""

from __future__ import annotations

import importlib
import json
import os
import sys
import textwrap
from dataclasses import fields

import pytest
import torch

from helpers import read_metrics, torchrun, train_args

from fastvideo import preflight
from fastvideo.components import COMPONENTS
from fastvideo.config import TrainConfig, build_parser, parse_config, validate_args
from fastvideo.training import lean

# A group-relative objective: advantage = reward - its prompt's group mean, weighting a flow-matching
# error. With one sample per prompt every advantage is 0, and so is the loss.
PLUGIN = textwrap.dedent('''
    import torch
    from fastvideo.algorithms.base import Objective, Term


    class GroupMean(Objective):
        name = "group_mean"
        needs_log_probs = False
        needs_trajectory = False

        def __init__(self, context):
            self.G, self.micro = context.group_size, context.update.train_micro_batch_size
            self.per_prompt = []

        def advantages(self, rewards):
            r = rewards.total.float()
            self.full = r - r.view(-1, self.G).mean(dim=1).repeat_interleave(self.G)
            return self.full

        def plan_update(self, traj, iteration):
            self.per_prompt = torch.unique(traj.group_ids, return_counts=True)[1].tolist()
            # the share of trained samples at an end of their group's advantages (one prompt per rank here)
            first = self.full.view(-1, self.G)[0]
            mine = first[traj.sample_ids % self.G]
            self.at_ends = ((mine == first.min()) | (mine == first.max())).float().mean().item()
            b = traj.num_samples
            return [[Term(m, torch.arange(s, min(b, s + self.micro)))] for m, s in enumerate(range(0, b, self.micro))]

        def loss(self, policy, traj, advantages, term, stats):
            rows = term.rows
            x0 = traj.x0[rows]
            g = torch.Generator().manual_seed(int(traj.sample_ids[rows[0]]))
            eps = torch.randn(x0.shape, generator=g)
            t = torch.full((x0.shape[0],), 0.5)
            v = policy.velocity(traj, rows, 0.5 * x0 + 0.5 * eps, t)
            err = ((v - (eps - x0)) ** 2).mean(dim=tuple(range(1, v.ndim)))
            stats.add(term, {"abs_adv": advantages[rows].abs().mean()})
            return (advantages[rows] * err).mean()

        def summarize(self, stats):
            counts = self.per_prompt
            return ({"abs_adv": stats.mean("abs_adv"), "at_ends": self.at_ends},
                    {"per_prompt_min": min(counts), "per_prompt_max": max(counts)})


    class KeepsOldPolicy(GroupMean):
        needs_old_policy = True


    class OldName(GroupMean):
        def rollout_weights(self):
            import contextlib
            self.entered = True
            return contextlib.nullcontext()
''')
MODULE = "group_mean_plugin"


@pytest.fixture
def plugin(tmp_path, monkeypatch):
    """The plugin module, importable from tmp_path (forked ranks inherit sys.path; a real torchrun the
    PYTHONPATH)."""
    (tmp_path / f"{MODULE}.py").write_text(PLUGIN)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(filter(None, [str(tmp_path), os.environ.get("PYTHONPATH")])))
    sys.modules.pop(MODULE, None)
    yield importlib.import_module(MODULE)
    sys.modules.pop(MODULE, None)


def _cfg(*flags):
    base = ["--data_json_path", "d.json", "--pretrained_model_name_or_path", "m", "--rewards", "compressibility:1"]
    argv = base + list(flags)
    return validate_args(build_parser(argv).parse_args(argv))


def test_num_generations_is_the_samples_per_prompt_of_any_objective(plugin):
    assert _cfg("--algorithm", f"{MODULE}:GroupMean", "--num_generations", "4").rollout.num_generations == 4
    # GRPO and NFT keep upstream's one sample per prompt without --use_group, said in a note
    for algorithm in ("grpo", "nft"):
        cfg = _cfg("--algorithm", algorithm, "--num_generations", "4")
        assert cfg.rollout.num_generations == 1
        assert any("--num_generations 4 has no effect without --use_group" in n for n in cfg.compat_notes)
        assert _cfg("--algorithm", algorithm, "--num_generations", "4", "--use_group").rollout.num_generations == 4


def test_another_objectives_flags_get_one_note(plugin):
    cfg = _cfg("--algorithm", f"{MODULE}:GroupMean", "--num_generations", "4", "--use_group", "--clip_range", "0.2",
               "--kl_coef", "0.1", "--nft_beta", "0.5")
    assert cfg.rollout.num_generations == 4
    grpo = [n for n in cfg.compat_notes if "--algorithm grpo" in n]
    assert grpo == ["--use_group, --clip_range, --kl_coef: no effect without --algorithm grpo"]
    assert [n for n in cfg.compat_notes if "--algorithm nft" in n] == ["--nft_beta: no effect without --algorithm nft"]
    assert not any("has no effect without --use_group" in n for n in cfg.compat_notes)  # G is used
    # GRPO's rules across sections are GRPO's: its smallest --sampling_steps (2) binds GRPO alone
    assert _cfg("--algorithm", f"{MODULE}:GroupMean", "--sampling_steps", "1").rollout.sampling_steps == 1
    with pytest.raises(ValueError, match="--sampling_steps 1 is too small"):
        _cfg("--sampling_steps", "1")
    # under NFT, GRPO's section is NFT's own (it shares the grouping, advantages and KL): no such note
    nft = _cfg("--algorithm", "nft", "--use_group", "--num_generations", "4", "--kl_coef", "0.1", "--clip_range", "0.2")
    assert not any("--algorithm grpo" in n for n in nft.compat_notes)
    assert any(n.startswith("--clip_range: no effect with --algorithm nft") for n in nft.compat_notes)


def test_the_memory_estimates_ask_the_objective(plugin, monkeypatch):
    """A plugin declaring an old policy gets the old-policy memory counted; a KL flag the objective does
    not read counts no reference model; the rollout's step latents as the objective declares them."""
    flags = ("--num_generations", "2", "--kl_coef", "0.1")

    def shape(algorithm):
        return lean.memory_shape(_cfg("--algorithm", algorithm, *flags), 1, torch.device("cpu"))

    kept, plain = shape(f"{MODULE}:KeepsOldPolicy"), shape(f"{MODULE}:GroupMean")
    assert kept.old_policy and not plain.old_policy
    assert not kept.kl_reference and not plain.kl_reference  # the plugin does not read --kl_coef
    grpo, nft = shape("grpo"), shape("nft")
    assert grpo.kl_reference and nft.kl_reference and nft.old_policy and not grpo.old_policy
    needs = _cfg("--algorithm", f"{MODULE}:KeepsOldPolicy").objective_needs()
    assert (needs.old_policy, needs.reference, needs.log_probs, needs.replay) == (True, False, False, False)

    seen = []

    def held(config, s, family, over):
        seen.append(s.keeps_latents)
        return 0

    monkeypatch.setattr("fastvideo.perf.memory.held_in_every_phase", held)
    monkeypatch.setattr(preflight, "Path", lambda *a: _Folder())
    for algorithm in ("grpo", "nft", f"{MODULE}:GroupMean"):
        assert preflight.memory_problems(_cfg("--algorithm", algorithm), 1, "cpu") == []
    assert seen == [True, False, False]


class _Folder:
    """A transformer folder whose config.json reads as {} (memory_problems reads nothing else)."""

    def __truediv__(self, other):
        return self

    def read_text(self):
        return "{}"


def test_an_objective_with_the_old_method_name_still_samples_with_its_weights(plugin):
    from fastvideo.algorithms.base import ObjectiveContext
    from fastvideo.component_settings.update import UpdateSettings

    ctx = ObjectiveContext(cfg=None, dims=None, device=torch.device("cpu"), update=UpdateSettings(), group_size=2)
    old = plugin.OldName(ctx)
    with old.sampling_policy():
        pass
    assert old.entered
    with plugin.GroupMean(ctx).sampling_policy():  # the default: the current weights
        pass


def test_the_config_is_one_section_per_component(tiny_flux_dir, tiny_embeddings, tmp_path):
    """TrainConfig's sections are the components' list; the data and parallel sections keep config.json's
    top-level keys and cfg.<field> access; the file round-trips."""
    assert [f.name for f in fields(TrainConfig)][:len(COMPONENTS)] == [name for name, _ in COMPONENTS]
    cfg = parse_config(train_args(tiny_embeddings, tiny_flux_dir, tmp_path, fsdp_sharding_strategy="hybrid", ignore_last=None,
                                  sp_size=1, embedding_cache_mb=7))
    assert (cfg.fsdp_strategy, cfg.embedding_cache_mb, cfg.prompts_per_rank) == ("hybrid", 7, 1)
    assert cfg.parallel.fsdp_strategy == "hybrid" and cfg.data.data_json_path == str(tiny_embeddings)
    resolved = cfg.to_json()
    assert resolved["fsdp_strategy"] == "hybrid" and resolved["data_json_path"] == str(tiny_embeddings)
    assert "data" not in resolved and "parallel" not in resolved
    path = tmp_path / "config.json"
    path.write_text(json.dumps({**resolved, "derived": cfg.derived(2), "device": "cpu"}))
    assert parse_config(["--config", str(path)]).to_dict() == cfg.to_dict()


def test_a_plugin_objective_without_use_group_trains_on_groups(plugin, tiny_flux_dir, tiny_embeddings, tmp_path):
    """2 iterations on 2 gloo ranks: every prompt got G = 4 samples and the loss is not 0 (with one
    sample per prompt, a group-relative advantage and its loss would be exactly 0)."""
    out = tmp_path / "run"
    proc = torchrun(train_args(tiny_embeddings, tiny_flux_dir, out, algorithm=f"{MODULE}:GroupMean", use_group=None,
                               num_generations=4, rollout_batch_size=2, save_images_every=0, checkpointing_steps=2))
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-6000:]
    rows = read_metrics(out)
    assert [r["iteration"] for r in rows] == [1, 2]
    for row in rows:
        assert row["per_prompt_min"] == row["per_prompt_max"] == 4
        assert row["loss"] != 0 and row["abs_adv"] > 0
        assert row["at_ends"] < 1.0  # all 4 train: the group's ends and its middles
    config = json.loads((out / "config.json").read_text())
    assert config["rollout"]["num_generations"] == 4 and config["derived"]["samples_per_rank"] == 4


def test_bestofn_trains_only_the_kept_samples(plugin, tiny_flux_dir, tiny_embeddings, tmp_path):
    """--bestofn 2 of G 4 on 2 gloo ranks, 1 iteration of the plugin objective (any objective gets it):
    every prompt's group reaches plan_update with its 2 kept samples (its lowest and highest
    advantage: the group's largest |adv| is one of them), the rollout still covers all 4, and the update
    makes half the forwards."""
    out = tmp_path / "run"
    proc = torchrun(train_args(tiny_embeddings, tiny_flux_dir, out, algorithm=f"{MODULE}:GroupMean", use_group=None,
                               num_generations=4, bestofn=2, rollout_batch_size=2, train_micro_batch_size=1,
                               save_images_every=0, max_train_steps=1, checkpointing_steps=1))
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-6000:]
    (row,) = read_metrics(out)
    assert row["per_prompt_min"] == row["per_prompt_max"] == 2 and row["trained_samples"] == 2
    assert row["forward_passes_update"] == 2 and row["forward_passes_rollout"] == 4 * 4  # 4 samples x 4 steps
    assert row["at_ends"] == 1.0 and row["abs_adv"] > 0  # without --bestofn: below 1 (the middles train too)
    config = json.loads((out / "config.json").read_text())
    assert config["rollout"]["bestofn"] == 2 and config["derived"]["micro_batches_per_rank"] == 2
