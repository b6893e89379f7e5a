"""flux-grpo: GRPO reinforcement learning for FLUX on Ascend NPU, NVIDIA GPU and CPU.

Importing this package needs no optional dependency (wandb, decord, hpsv2, the Ascend extension).
"""

__version__ = "0.1.0"
