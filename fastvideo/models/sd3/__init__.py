"""Stable Diffusion 3 / 3.5: the building blocks (components) and the ModelFamily (family), registered as "sd3"."""

from fastvideo.models.sd3.family import SD3Family  # noqa: F401
