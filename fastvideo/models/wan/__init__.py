"""Wan2.1-T2V and Wan2.2-TI2V-5B: the building blocks (components), the ModelFamily (family) and its
settings (--num_frames), registered as "wan". Importable on both library lines (the registry imports
it); the family itself is refused on the recipe line (``WanFamily.library_line``: diffusers 0.32 has
no Wan)."""

from fastvideo.models.wan.family import WanFamily  # noqa: F401
