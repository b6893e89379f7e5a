"""Stable Diffusion 3 / 3.5: the building blocks (components) and the ModelFamily (family);
fastvideo.models.registry registers it as "sd3"."""

from fastvideo.models.sd3.family import SD3Family  # noqa: F401
