"""Facts taken from upstream code at pinned commits, kept in tests/fixtures/upstream_facts.json so the
comparisons run on every machine (no upstream repository needed).

Each fact is what upstream's own function returns on fixed inputs, computed by running that function
from the upstream file (``git show COMMIT:PATH``). Regenerate, or check that the fixture still holds,
where the repositories are present (FLUX_GRPO_UPSTREAM_DIR, tests/upstream_repos.py):

    FLUX_GRPO_UPSTREAM_DIR=DIR python tests/upstream_facts.py --write   # rewrite the fixture
    tests/test_upstream_facts.py                                         # recompute and compare

Sources (all public GitHub repositories):
- XueZeyue/DanceGRPO 15cc71d, fastvideo/utils/fsdp_util.py: apply_fsdp_checkpointing (Apache-2.0)
- yifan123/flow_grpo ac4c86e, flow_grpo/stat_tracking.py: PerPromptStatTracker (MIT)
- Tencent-Hunyuan/MixGRPO e5cdd6a, fastvideo/utils/grpo_states.py: GRPOTrainingStates
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from upstream_repos import upstream_repo

FIXTURE = Path(__file__).resolve().parent / "fixtures" / "upstream_facts.json"
DANCEGRPO = ("XueZeyue/DanceGRPO", "15cc71d53cc2e6e18a68ee607d5fb6ba9a99e344", "fastvideo/utils/fsdp_util.py")
FLOW_GRPO = ("yifan123/flow_grpo", "ac4c86e8cae021841f1fde853d340e0db67690dd", "flow_grpo/stat_tracking.py")
MIXGRPO = ("Tencent-Hunyuan/MixGRPO", "e5cdd6a427778d8c8b2e7a48ce16972141adbe7c", "fastvideo/utils/grpo_states.py")
SOURCES = (DANCEGRPO, FLOW_GRPO, MIXGRPO)

CHECKPOINT_FRACTIONS = [0.25, 0.3, 0.5, 2 / 3, 0.9, 1.0, 0.0]
# 24 rewards (3 prompts x G 8, contiguous) on growing scales; plain decimals so no RNG is involved.
STAT_REWARDS = [round(((i * 7919) % 97) / 97 * i / 10, 6) for i in range(24)]
STAT_PROMPTS = [f"prompt {i // 8}" for i in range(24)]
MIX_STRATEGIES = ["progressive", "decay", "exp_decay"]
MIX_ITERS = 120


def sources_present() -> bool:
    return all(upstream_repo(repo).is_dir() for repo, _, _ in SOURCES)


def _source(repo: str, commit: str, path: str) -> str:
    return subprocess.run(["git", "--git-dir", str(upstream_repo(repo)), "show", f"{commit}:{path}"],
                          capture_output=True, text=True, check=True).stdout


def _exec(source: str, name: str, extra: dict | None = None) -> dict:
    ns: dict = dict(extra or {})
    exec(compile(source, name, "exec"), ns)  # the reference: upstream's own code
    return ns


def selective_checkpointing_facts(source: str) -> dict:
    """{fraction: block indices} upstream's apply_fsdp_checkpointing picks among 57 FLUX blocks."""
    start = source.index("def apply_fsdp_checkpointing")
    fn_src = source[start:source.index("\ndef ", start + 1)]

    class Block:
        pass

    out = {}
    for fraction in CHECKPOINT_FRACTIONS:
        picked: list[int] = []

        def fake_apply(model, checkpoint_wrapper_fn, check_fn):  # torch's helper: ask each module
            picked.extend(i for i, b in enumerate(model) if check_fn(b))

        ns = _exec(fn_src, "fsdp_util.py", {"apply_activation_checkpointing": fake_apply,
                                            "non_reentrant_wrapper": None, "print": lambda *a: None})
        ns["apply_fsdp_checkpointing"]([Block() for _ in range(57)], Block, fraction)
        out[repr(fraction)] = picked
    return out


def stat_tracker_facts(source: str) -> dict:
    """PerPromptStatTracker(global_std=True/False).update on STAT_REWARDS / STAT_PROMPTS."""
    import numpy as np

    ns = _exec(source, "flow_grpo/stat_tracking.py")
    r = np.asarray(STAT_REWARDS, dtype=np.float64)
    return {mode: [float(x) for x in ns["PerPromptStatTracker"](global_std=(mode == "global")).update(STAT_PROMPTS, r)]
            for mode in ("global", "per_prompt")}


def mix_window_facts(source: str) -> dict:
    """cur_timestep of GRPOTrainingStates after each of MIX_ITERS iterations per strategy (16 steps, W 4,
    3 iterations per group, overlap 2, 1..5 iterations per group, roll back), and the set of starts the
    random strategy reaches over 400 seeds (W 4, 14 timesteps)."""
    ns = _exec(source, "grpo_states.py")
    states = ns["GRPOTrainingStates"]
    out: dict = {}
    for strategy in MIX_STRATEGIES:
        ref = states(iters_per_group=3, group_size=4, max_timesteps=14, sample_strategy=strategy, prog_overlap=True,
                     prog_overlap_step=2, max_iters_per_group=5, min_iters_per_group=1, roll_back=True)
        seq = []
        for _ in range(1, MIX_ITERS):
            seq.append(int(ref.cur_timestep))
            ref.update_iteration()
        out[strategy] = seq
    ref = states(iters_per_group=1, group_size=4, max_timesteps=14, sample_strategy="random")
    reached = {int(ref.cur_timestep)}
    for seed in range(400):
        ref.update_iteration(seed)
        reached.add(int(ref.cur_timestep))
    out["random_reached"] = sorted(reached)
    return out


def compute_facts() -> dict:
    """Every fact, recomputed from the upstream repositories (they must be present)."""
    return {
        "sources": {repo: {"commit": commit, "path": path} for repo, commit, path in SOURCES},
        "dancegrpo_selective_checkpointing": selective_checkpointing_facts(_source(*DANCEGRPO)),
        "flow_grpo_stat_tracker": stat_tracker_facts(_source(*FLOW_GRPO)),
        "mixgrpo_window_starts": mix_window_facts(_source(*MIXGRPO)),
    }


def load_facts() -> dict:
    return json.loads(FIXTURE.read_text())


if __name__ == "__main__":
    if "--write" not in sys.argv[1:]:
        sys.exit("usage: FLUX_GRPO_UPSTREAM_DIR=DIR python tests/upstream_facts.py --write")
    if not sources_present():
        sys.exit("upstream_facts.py: set FLUX_GRPO_UPSTREAM_DIR to a folder holding the upstream repositories")
    FIXTURE.parent.mkdir(exist_ok=True)
    FIXTURE.write_text(json.dumps(compute_facts(), indent=1) + "\n")
    print(f"wrote {FIXTURE}")
