"""Shared set-up for the sampling tests."""

from fastvideo.models import flux


def tiny_models(model_dir, prompts, seq):
    """(transformer in eval mode, VAE, prompt embeds [P, seq, D], pooled [P, P'], text ids) of the tiny FLUX."""
    transformer = flux.load_transformer(model_dir).eval()
    vae = flux.load_vae(model_dir)
    embeds, pooled, text_ids = flux.encode_prompts(flux.load_text_encoders(model_dir), prompts, max_sequence_length=seq)
    return transformer, vae, embeds, pooled, text_ids
