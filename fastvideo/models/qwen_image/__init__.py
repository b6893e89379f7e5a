"""Qwen-Image: the building blocks (components), the ModelFamily (family), registered as "qwen_image",
and its NPU adapter (npu). Importable on both library lines (the registry imports it); the family
itself is refused on the recipe line (``QwenImageFamily.library_line``)."""

from fastvideo.models.qwen_image.family import QwenImageFamily  # noqa: F401
