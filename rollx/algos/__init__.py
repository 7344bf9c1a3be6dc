"""Pure jax.numpy on batches: advantages (registry by adv_estimator), losses, KL control."""
