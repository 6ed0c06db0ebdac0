"""Shared test setup: strict numerics, and remat kept on CPU for every compile.

Tests compile with plain ``jax.jit`` too; XLA's CPU compiler would drop
``jax.checkpoint``'s barriers there (and jaxremat would warn), so the process-wide flag
that keeps them is set before JAX starts, as docs/quickstart.md tells users to.
"""

import os

#: ``xla_backend_optimization_level=0``: LLVM compiles the tests' programs without its
#: optimisations (its codegen level), 1.3-1.9x faster CPU compiles here. XLA's
#: HLO passes and buffer assignment, so every byte measured, do not depend on it: the
#: footprints of the ViT, ResNet and U-Net of realworld_models.py, without remat and
#: under default apply's plan, were equal to the byte at both levels. Users' compiles keep
#: XLA's default.
os.environ["XLA_FLAGS"] = " ".join(
    [os.environ.get("XLA_FLAGS", ""), "--xla_disable_hlo_passes=cse_barrier_expander",
     "--xla_backend_optimization_level=0"]).strip()

import jax  # noqa: E402

jax.config.update("jax_numpy_rank_promotion", "raise")
