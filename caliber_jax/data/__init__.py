"""Host-side data: corpus reading, numeric perturbations and NumGap construction (no jax)."""
