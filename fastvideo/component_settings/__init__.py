"""Settings of the components whose code lives in packages that read the training config
(training/: LoRA, optimiser, the update's micro-batching, checkpoints and outputs; eval/: evaluation
and the guard).

They sit here rather than next to their code so that fastvideo.config, which composes them, never
imports a package that imports it back (no import cycle between sub-packages). Each follows the
convention of fastvideo.settings; the old import paths (fastvideo.training.lora,
fastvideo.eval.settings) re-export them."""
