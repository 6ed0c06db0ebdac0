"""Shared test setup: strict numerics and a few small models."""

import jax

jax.config.update("jax_numpy_rank_promotion", "raise")
