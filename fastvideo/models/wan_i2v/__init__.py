"""Wan2.1-I2V (image to video): Wan's family with a first frame per prompt, registered as "wan_i2v".
Importable on both library lines (the registry imports it); the family itself is refused on the
recipe line (Wan's ``library_line``)."""

from fastvideo.models.wan_i2v.family import WanI2VFamily  # noqa: F401
