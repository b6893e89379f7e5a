"""FLUX.2 [klein]: the building blocks (components) and the ModelFamily (family), registered as
"flux2". Importable on both library lines (the registry imports it); the family itself is refused
on the recipe line (``Flux2Family.library_line``)."""

from fastvideo.models.flux2.family import Flux2Family  # noqa: F401
