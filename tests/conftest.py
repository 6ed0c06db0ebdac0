"""Shared test setup: strict numerics, and remat kept on CPU for every compile.

Tests compile with plain ``jax.jit`` too; XLA's CPU compiler would drop
``jax.checkpoint``'s barriers there (and jaxremat would warn), so the process-wide flag
that keeps them is set before JAX starts, as docs/quickstart.md tells users to.
"""

import os

#: ``xla_backend_optimization_level=0``: LLVM compiles the tests' programs without its
#: optimisations, which halves a CPU compile here. XLA's HLO passes and its buffer
#: assignment, hence every byte measured, are the same at every level (a footprint's figures
#: are equal at both); users' compiles keep XLA's default.
os.environ["XLA_FLAGS"] = " ".join(
    [os.environ.get("XLA_FLAGS", ""), "--xla_disable_hlo_passes=cse_barrier_expander",
     "--xla_backend_optimization_level=0"]).strip()

import jax  # noqa: E402

jax.config.update("jax_numpy_rank_promotion", "raise")
