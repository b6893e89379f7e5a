"""FLUX.2 [klein] editing: Flux2KleinPipeline's reference-image path (``image=``) on FLUX.2's code
(fastvideo.models.flux2), the source image's latent tokens after the generated ones;
fastvideo.models.registry registers it as "flux2_edit"."""
