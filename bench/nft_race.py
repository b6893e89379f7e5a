"""Equal-CPU-time race on the tiny demo task: DiffusionNFT vs DanceGRPO vs MixGRPO-Flash.

    OMP_NUM_THREADS=1 python bench/nft_race.py [--seeds 1 2] [--iterations 30] [--json P] [--plot P]

bench/mix_learning.py's harness with --equal_time (every mode gets the CPU seconds of the same
seed's DanceGRPO run; median CPU seconds to the target gain, runs reaching it, paired counts and a
sign test against DanceGRPO), with two NFT modes (--algorithm nft, DPM-Solver++ rollouts of the
same 8 steps, per-sample initial noise, every timestep trained, beta 1, decay type 1):

- nft: one optimizer step per iteration over the whole group of 8 (the demo's micro-batches of 4,
  --gradient_accumulation_steps 2), as the reference's gradient_step_per_epoch 1, at lr 1e-2
  (chosen on seeds 1-3 at 30 equal iterations: docs/nft.md);
- nft_split: the demo's GRPO split (2 optimizer steps of half a group each) at its lr 3e-3, the
  configuration of the first, 12-seed race.

--json is rewritten after every seed, so a race stopped early keeps its finished seeds (summarize
them with --from_json). A benchmark, not a test.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import mix_learning  # noqa: E402

NFT = ["--algorithm", "nft", "--nft_solver", "dpm", "--nft_beta", "1.0", "--nft_decay_type", "1"]
mix_learning.MODES["nft"] = NFT + ["--gradient_accumulation_steps", "2", "--learning_rate", "1e-2"]
mix_learning.MODES["nft_split"] = NFT  # the demo's micro-batches of 4, GA 1, lr 3e-3

if __name__ == "__main__":
    argv = sys.argv[1:]
    if "--modes" not in argv and "--from_json" not in argv:
        argv += ["--modes", "full", "flash", "nft", "nft_split"]
    if "--equal_time" not in argv:
        argv.append("--equal_time")
    sys.argv = [sys.argv[0], *argv]
    mix_learning.main()
