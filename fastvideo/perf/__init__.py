"""Performance accounting: analytic FLOPs of GRPO (the transformer's from its model family) and
utilisation (see docs/performance.md)."""

from fastvideo.perf.flops import (
    IterationFlops,
    IterationShape,
    count_flops,
    image_tokens_for,
    iteration_flops,
    peak_tflops_for,
    utilisation,
    vae_decoder_flops,
)

__all__ = [
    "IterationFlops",
    "IterationShape",
    "count_flops",
    "image_tokens_for",
    "iteration_flops",
    "peak_tflops_for",
    "utilisation",
    "vae_decoder_flops",
]
