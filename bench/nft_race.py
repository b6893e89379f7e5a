"""Equal-CPU-time race on the tiny demo task: DiffusionNFT vs DanceGRPO vs MixGRPO-Flash.

    OMP_NUM_THREADS=1 python bench/nft_race.py [--seeds 1 2] [--iterations 30] [--json P] [--plot P]

bench/mix_learning.py's harness with --equal_time (every mode gets the CPU seconds of the same
seed's DanceGRPO run; median CPU seconds to the target gain, runs reaching it, paired counts and a
sign test against DanceGRPO), with one more mode: NFT (--algorithm nft, DPM-Solver++ rollouts of
the same 8 steps, per-sample initial noise, every timestep trained, beta 1, decay type 1) at the
demo's learning rate (GRPO's 3e-3), and nft_lr3e-4 at the reference's. --json is rewritten after
every seed, so a race stopped early keeps its finished seeds (summarize them with --from_json).
A benchmark, not a test.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import mix_learning  # noqa: E402

mix_learning.MODES["nft"] = ["--algorithm", "nft", "--nft_solver", "dpm", "--nft_beta", "1.0",
                             "--nft_decay_type", "1"]
# The reference's own learning rate (config/nft.py: 3e-4, with LoRA) instead of the demo's GRPO 3e-3.
mix_learning.MODES["nft_lr3e-4"] = mix_learning.MODES["nft"] + ["--learning_rate", "3e-4"]


if __name__ == "__main__":
    argv = sys.argv[1:]
    if "--modes" not in argv and "--from_json" not in argv:
        argv += ["--modes", "full", "flash", "nft", "nft_lr3e-4"]
    if "--equal_time" not in argv:
        argv.append("--equal_time")
    sys.argv = [sys.argv[0], *argv]
    mix_learning.main()
