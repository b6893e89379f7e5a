"""FLUX.1: the building blocks (components) and the ModelFamily (family); fastvideo.models.registry
registers it as "flux"."""

from fastvideo.models.flux.components import (  # noqa: F401
    FLUX_DOWNLOAD_HINT,
    REQUIRED_FILES,
    WEIGHT_SUFFIXES,
    FluxFolderError,
    TextEncoders,
    adapt_for_device,
    check_flux_folder,
    decode_latents,
    encode_prompts,
    image_ids,
    latent_hw,
    load_text_encoders,
    load_transformer,
    load_vae,
    pack_latents,
    predict_velocity,
    text_ids,
    unnormalize_latents,
    unpack_latents,
    vae_scale_factor,
)
from fastvideo.models.flux.family import ExpectedDims, FluxFamily  # noqa: F401
