"""The named benchmark models of bench/, ``jaxremat bench`` and the GPU scripts, in one place.

Each ``BenchModel`` says how to build its flax module, the example batch (a
``jax.ShapeDtypeStruct``, and a smaller one for quick runs), its ``apply`` kwargs and tags:

* ``cpu``: the CPU zoo of ``bench/memory.py`` (``cpu-quick``: its ``--quick`` run);
* ``bench``: ``jaxremat bench`` (``bench-quick``: its default ``--quick`` models);
* ``gpu``: ``bench/gpu_validate.py`` (``gpu-quick``: its ``--quick`` run);
* ``gpu-earlier``: GPU models of earlier runs, read by ``bench/gpu_offline.py``;
* ``scan``: scanned layer stacks, in ``bench/policies.py`` beside the CPU zoo.

Names are those of the recorded results; batches are drawn with key 1 (``example``).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from typing import Any

import jax
import jax.numpy as jnp

from jaxremat import zoo

#: Integer batches are tokens below this (every zoo vocabulary is at least 256).
TOKEN_VOCAB = 256

BN: Mapping[str, Any] = {"mutable": ["batch_stats"]}


@dataclasses.dataclass(frozen=True)
class BenchModel:
  """A benchmark model: its builder, example batch, ``apply`` kwargs and tags."""

  name: str
  build: Callable[[], Any]
  batch: jax.ShapeDtypeStruct
  kwargs: Mapping[str, Any] = dataclasses.field(default_factory=dict)
  tags: frozenset[str] = frozenset()
  quick_batch: jax.ShapeDtypeStruct | None = None  # the batch of quick runs, if smaller
  rngs: Mapping[str, int] = dataclasses.field(default_factory=dict)  # apply rngs: name -> seed

  def batch_spec(self, quick: bool = False) -> jax.ShapeDtypeStruct:
    """The batch's shape and dtype (``quick_batch`` when ``quick`` and there is one)."""
    return self.quick_batch if quick and self.quick_batch is not None else self.batch

  def example(self, quick: bool = False) -> jax.Array:
    """The example batch: normal floats, or integer tokens below ``TOKEN_VOCAB``; key 1."""
    spec = self.batch_spec(quick)
    if jnp.issubdtype(spec.dtype, jnp.integer):
      return jax.random.randint(jax.random.key(1), spec.shape, 0, TOKEN_VOCAB).astype(spec.dtype)
    return jax.random.normal(jax.random.key(1), spec.shape).astype(spec.dtype)

  def apply_kwargs(self) -> dict[str, Any]:
    """``kwargs`` with the ``rngs`` made into keys."""
    if not self.rngs:
      return dict(self.kwargs)
    return {**self.kwargs, "rngs": {k: jax.random.key(s) for k, s in self.rngs.items()}}

  def instantiate(self, quick: bool = False) -> tuple[Any, jax.Array, Any]:
    """``(model, batch, params)``: the model built, its batch, and parameters at key 0."""
    model, x = self.build(), self.example(quick)
    return model, x, jax.jit(model.init)(jax.random.key(0), x)


def _f(*shape: int, dtype: Any = jnp.float32) -> jax.ShapeDtypeStruct:
  return jax.ShapeDtypeStruct(shape, jnp.dtype(dtype))


def _m(name: str, build: Callable[[], Any], batch: jax.ShapeDtypeStruct, *tags: str,
       kwargs: Mapping[str, Any] | None = None, quick: jax.ShapeDtypeStruct | None = None,
       rngs: Mapping[str, int] | None = None) -> BenchModel:
  return BenchModel(name, build, batch, dict(kwargs or {}), frozenset(tags), quick,
                    dict(rngs or {}))


_UNEVEN = (512, 1024, 256, 2048, 128, 512, 10)
_IMAGES_QUICK = _f(4, 16, 16, 3)  # jaxremat bench --quick
_VECTORS_QUICK = 32

#: Every benchmark model, in the order the benchmarks run them (``bench-quick``: as recorded).
MODELS: tuple[BenchModel, ...] = (
    # The CPU zoo (bench/memory.py) and jaxremat bench: sizes that compile in seconds on 2 cores.
    _m("tiny-mlp", lambda: zoo.mlp([32, 64, 16, 48, 10]), _f(8, 20), "bench"),
    _m("vgg11-w0.25", lambda: zoo.vgg("vgg11", width=0.25), _f(16, 32, 32, 3),
       "cpu", "cpu-quick", "bench", quick=_IMAGES_QUICK),
    _m("resnet-3stage-w16", lambda: zoo.resnet((1, 1, 1), width=16), _f(16, 32, 32, 3), "bench",
       kwargs=BN, quick=_IMAGES_QUICK),
    _m("vgg16-w0.25", lambda: zoo.vgg("vgg16", width=0.25), _f(16, 32, 32, 3), "cpu"),
    _m("vgg19-w0.25", lambda: zoo.vgg("vgg19", width=0.25), _f(16, 32, 32, 3), "cpu"),
    _m("vgg11-224px-w0.125", lambda: zoo.vgg("vgg11", width=0.125, hidden=256, num_classes=1000),
       _f(2, 224, 224, 3), "cpu"),
    _m("resnet18-w0.25", lambda: zoo.resnet_by_name("resnet18", width=0.25), _f(16, 32, 32, 3),
       "cpu", "cpu-quick", kwargs=BN),
    _m("resnet50-w0.125-d0.34", lambda: zoo.resnet_by_name("resnet50", width=0.125, depth=0.34),
       _f(16, 32, 32, 3), "cpu", kwargs=BN),
    _m("resnet152-w0.125-d0.15",
       lambda: zoo.resnet_by_name("resnet152", width=0.125, depth=0.15), _f(8, 32, 32, 3), "cpu",
       kwargs=BN),
    _m("vit-d64-L6", lambda: zoo.vit(patch=4, dim=64, depth=6, num_heads=4), _f(16, 32, 32, 3),
       "cpu", "cpu-quick"),
    _m("gpt-causal-d64-L6-s128",
       lambda: zoo.gpt(vocab_size=256, max_len=128, dim=64, depth=6, num_heads=4),
       _f(8, 128, dtype=jnp.int32), "cpu"),
    _m("gpt-scan-d64-L6-s128",
       lambda: zoo.gpt(vocab_size=256, max_len=128, dim=64, depth=6, num_heads=4, scan=True),
       _f(8, 128, dtype=jnp.int32), "scan"),
    _m("mlp-uneven", lambda: zoo.mlp(_UNEVEN), _f(256, 300), "cpu", "cpu-quick", "bench",
       "bench-quick", quick=_f(_VECTORS_QUICK, 300)),
    _m("mlp-uneven-bf16", lambda: zoo.mlp(_UNEVEN, dtype=jnp.bfloat16),
       _f(256, 300, dtype=jnp.bfloat16), "cpu", "bench",
       quick=_f(_VECTORS_QUICK, 300, dtype=jnp.bfloat16)),
    _m("all-conv", zoo.all_conv, _f(16, 32, 32, 3), "bench", "bench-quick", quick=_IMAGES_QUICK),
    _m("dropout-mlp", lambda: zoo.DropoutMLP((512, 1024, 256, 1024, 10)), _f(256, 300), "bench",
       quick=_f(_VECTORS_QUICK, 300), rngs={"dropout": 3}),
    # GPU models (bench/gpu_validate.py and the scripts reading its results).
    _m("vgg11-w0.25-b8", lambda: zoo.vgg("vgg11", width=0.25), _f(8, 32, 32, 3), "gpu-quick"),
    _m("mlp-uneven-b64", lambda: zoo.mlp([256, 1024, 128, 2048, 64, 10]), _f(64, 128),
       "gpu-quick"),
    _m("resnet18-b1024-32px", lambda: zoo.resnet((2, 2, 2, 2)), _f(1024, 32, 32, 3), "gpu",
       kwargs=BN),
    _m("vgg16-b512-32px", lambda: zoo.vgg("vgg16"), _f(512, 32, 32, 3), "gpu"),
    _m("mlp-uneven-b4096", lambda: zoo.mlp([4096, 16384, 2048, 16384, 1024, 8192, 1000]),
       _f(4096, 1024), "gpu"),
    _m("vgg16-bf16-b512", lambda: zoo.vgg("vgg16", dtype=jnp.bfloat16),
       _f(512, 32, 32, 3, dtype=jnp.bfloat16), "gpu"),
    _m("vgg11-b32-224px", lambda: zoo.vgg("vgg11", num_classes=1000, hidden=4096),
       _f(32, 224, 224, 3), "gpu"),
    _m("vit-d384-L12-b256", lambda: zoo.vit(patch=4, dim=384, depth=12, num_heads=6),
       _f(256, 32, 32, 3), "gpu"),
    _m("gpt-d512-L8-b8-s1024",
       lambda: zoo.gpt(vocab_size=8192, max_len=1024, dim=512, depth=8, num_heads=8),
       _f(8, 1024, dtype=jnp.int32), "gpu"),
    # The 2026-11-22 H100 runs (bench/results/gpu-h100-2026-11-22-run1 at commit 929b4fa).
    _m("vgg16-b128-32px", lambda: zoo.vgg("vgg16"), _f(128, 32, 32, 3), "gpu-earlier"),
    _m("resnet18-b256-32px", lambda: zoo.resnet((2, 2, 2, 2)), _f(256, 32, 32, 3),
       "gpu-earlier", kwargs=BN),
)

_BY_NAME = {m.name: m for m in MODELS}
assert len(_BY_NAME) == len(MODELS), "benchmark model names must be unique"


def tagged(*tags: str) -> tuple[BenchModel, ...]:
  """The models carrying any of ``tags``, in ``MODELS`` order."""
  return tuple(m for m in MODELS if m.tags & set(tags))


def get(name: str) -> BenchModel:
  """The model named ``name``; ``KeyError`` naming the choices when there is none."""
  try:
    return _BY_NAME[name]
  except KeyError:
    raise KeyError(f"no benchmark model {name!r}; choose from {', '.join(_BY_NAME)}") from None
