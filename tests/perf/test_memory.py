

def test_gradients_and_activations_peak_apart_without_accumulation():
    prof = memory.ModelProfile(params=1000, largest_block_params=100, root_params=0, update_activations=5000,
                               rollout_activations=0, vae_params=0, vae_decode=0)
    held = memory.estimate({"in_channels": 64, "joint_attention_dim": 8, "pooled_projection_dim": 4},
                           {}, _shape(strategy="none", world_size=2), prof)
    apart = memory.estimate({"in_channels": 64, "joint_attention_dim": 8, "pooled_projection_dim": 4},
                            {}, _shape(strategy="none", world_size=2, grads_held=False), prof)
    assert held.peak_bytes - apart.peak_bytes == 1000 * 4  # the gradients are not there at the activation peak
    assert apart.components["gradients"] == 0 and apart.components["ddp_buckets"] == 4000
