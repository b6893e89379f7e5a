"""Z-Image: the building blocks (components) and the ModelFamily (family), registered as "zimage".
Importable on both library lines (the registry imports it); the family itself is refused on the
recipe line (``ZImageFamily.library_line``)."""

from fastvideo.models.zimage.family import ZImageFamily  # noqa: F401
