"""flux-grpo: GRPO reinforcement learning for FLUX on Ascend NPU, NVIDIA GPU and CPU.

Importing this package needs no optional dependency (wandb, av, hpsv2, the Ascend extension).
"""

__version__ = "0.1.0"

from fastvideo.library_lines import quiet_library_noise as _quiet

_quiet()  # library progress bars off a terminal, diffusers 0.42's empty float32 warning (library_lines)
