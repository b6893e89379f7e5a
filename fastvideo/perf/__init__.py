"""Performance accounting: analytic FLOPs of FLUX GRPO and utilisation (see docs/performance.md)."""

from fastvideo.perf.flops import (
    FLUX_DEV,
    FLUX_DEV_VAE_CONFIG,
    FluxDims,
    IterationFlops,
    IterationShape,
    count_flops,
    image_tokens_for,
    iteration_flops,
    peak_tflops_for,
    transformer_backward_flops,
    transformer_block_flops,
    transformer_flops_breakdown,
    transformer_forward_flops,
    utilisation,
    vae_decoder_flops,
)

__all__ = [
    "FLUX_DEV",
    "FLUX_DEV_VAE_CONFIG",
    "FluxDims",
    "IterationFlops",
    "IterationShape",
    "count_flops",
    "image_tokens_for",
    "iteration_flops",
    "peak_tflops_for",
    "transformer_backward_flops",
    "transformer_block_flops",
    "transformer_flops_breakdown",
    "transformer_forward_flops",
    "utilisation",
    "vae_decoder_flops",
]
