"""Shared set-up for the sampling tests."""

from fastvideo.models import flux
from fastvideo.models.base import TensorConditioning


def tiny_models(model_dir, prompts, seq):
    """(transformer in eval mode, VAE, prompt embeds [P, seq, D], pooled [P, P'], text ids) of the tiny FLUX."""
    transformer = flux.load_transformer(model_dir).eval()
    vae = flux.load_vae(model_dir)
    embeds, pooled, text_ids = flux.encode_prompts(flux.load_text_encoders(model_dir), prompts, max_sequence_length=seq)
    return transformer, vae, embeds, pooled, text_ids


def flux_cond(embeds, pooled, text_ids) -> TensorConditioning:
    """FLUX's Conditioning from its three tensors."""
    return TensorConditioning({"prompt_embeds": embeds, "pooled": pooled}, {"text_ids": text_ids})


def flux_rollout(transformer, vae, embeds, pooled, text_ids, captions, group_ids, cfg, randomness, iteration, device,
                 autocast_dtype=None, decode=True, on_chunk=None, plan=None, keep_latents=True, family=None,
                 keep_log_probs=True):
    """rollout() with FLUX's tensors and the former defaults: FLUX with its default forward settings
    (unless ``family`` is given), and without a plan DanceGRPO's (every transition SDE)."""
    from fastvideo.sampling.plan import full_sde_plan
    from fastvideo.sampling.rollout import rollout

    family = family if family is not None else flux.FluxFamily()
    n = cfg.sampling_steps
    plan = plan if plan is not None else full_sde_plan(n, cfg.shift, n, 1)
    return rollout(family, transformer, vae, flux_cond(embeds, pooled, text_ids), captions, group_ids, cfg,
                   randomness, iteration, device, autocast_dtype, decode, on_chunk, plan=plan,
                   keep_latents=keep_latents, keep_log_probs=keep_log_probs)
