"""FLUX.1 Kontext [dev]: instruction-based editing on FLUX.1's code (fastvideo.models.flux), the
source image's latent tokens concatenated to the generated ones; fastvideo.models.registry
registers it as "kontext"."""
