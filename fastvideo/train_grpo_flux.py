"""GRPO fine-tuning of FLUX: thin entry point (parse -> build -> train -> clean up).

    torchrun --nproc_per_node=N fastvideo/train_grpo_flux.py --data_json_path ... [flags]

Accepts upstream DanceGRPO's and the Ascend recipe's flags (see fastvideo/config.py).
"""

from __future__ import annotations

import os
import sys
import warnings

# torch's FSDP1 optimizer-state gather warns about gloo/CPU process groups at every checkpoint;
# the warnings are about a deprecated internal helper and say nothing the user can act on.
warnings.filterwarnings("ignore", message=".*_get_pg_default_device.*")
warnings.filterwarnings("ignore", message="Multiple backends are registered with this ProcessGroup.*")


def main(argv: list[str] | None = None) -> int:
    # Imports inside main so that `--help` and flag errors come back fast.
    from fastvideo import platform
    from fastvideo.config import parse_config
    from fastvideo.errors import report_failure
    from fastvideo.training.trainer import GRPOTrainer

    cfg = parse_config(argv)
    info = platform.init_distributed()
    try:
        trainer = GRPOTrainer(cfg, info)
        trainer.setup()
        trainer.train()
    except BaseException as exc:
        if isinstance(exc, SystemExit) and not exc.code:
            raise
        # Say which rank failed and why (a user error as its message alone, exit 2; anything else
        # with its traceback, exit 1), then exit without waiting on collectives: torchrun sees the
        # failure and stops the other ranks instead of letting them hang.
        code = report_failure(exc, "train_grpo_flux", info.rank if info.world_size > 1 else None)
        if info.world_size > 1:
            os._exit(code)
        return code
    platform.barrier()
    platform.destroy_distributed()
    return 0


if __name__ == "__main__":
    if __package__ in (None, ""):
        # Run as a script path (torchrun fastvideo/train_grpo_flux.py, as upstream's launchers do):
        # Python put fastvideo/ first on sys.path, where fastvideo/platform.py would shadow the
        # standard library's `platform`. Replace it with the repository root.
        here = os.path.dirname(os.path.abspath(__file__))
        sys.path[:] = [p for p in sys.path if os.path.abspath(p or ".") != here]
        sys.path.insert(0, os.path.dirname(here))
    sys.exit(main())
