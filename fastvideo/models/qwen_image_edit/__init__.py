"""Qwen-Image-Edit (2509 / 2511): instruction-based editing on Qwen-Image's code
(fastvideo.models.qwen_image), the source image read by the VL text encoder and as extra latent
tokens; fastvideo.models.registry registers it as "qwen_image_edit"."""
