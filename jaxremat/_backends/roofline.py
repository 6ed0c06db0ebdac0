"""A roofline time model: seconds of an XLA program from its cost analysis (issue 24).

``seconds = max(flops / flops_per_second, bytes_accessed / bytes_per_second)``, with
``flops`` and ``bytes accessed`` as XLA's cost analysis counts them for the lowered
program. GPU targets take their figures from the devices' public data sheets; the local
device is measured once per process (a matrix product and a copy, both jitted, and on a
GPU a copy to pinned host memory).
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable, Iterator, Mapping
from typing import Any

import jax
import jax.extend.core as jex_core
import jax.numpy as jnp

from jaxremat._backends.step_time import best_step_seconds
from jaxremat._backends.targets import Target, config_number, get_target
from jaxremat._errors import InvalidArgumentError
from jaxremat._jaxpr import compat as _compat


@dataclasses.dataclass(frozen=True)
class Roofline:
  """Peak rates of one device.

  Attributes:
    name: the device.
    flops_per_second: matrix-product FLOP/s (f32 inputs as XLA runs them by default).
    bytes_per_second: device memory bandwidth (bytes/s).
    host_bytes_per_second: device-to-host link bandwidth for offload (bytes/s; 0: none).
    host_overlap: share of offload traffic hidden behind compute (0..1).
  """

  name: str
  flops_per_second: float
  bytes_per_second: float
  host_bytes_per_second: float = 0.0
  host_overlap: float = 0.0

  def seconds(self, flops: float, bytes_accessed: float) -> float:
    """The roofline time of a program of ``flops`` FLOPs touching ``bytes_accessed`` bytes."""
    return max(flops / self.flops_per_second, bytes_accessed / self.bytes_per_second)

  def offload_seconds(self, num_bytes: float) -> float:
    """What moving ``num_bytes`` to host memory and back adds to a step (seconds)."""
    if not self.host_bytes_per_second:
      return float("inf")
    return 2 * num_bytes / self.host_bytes_per_second * (1 - self.host_overlap)


#: Share of offload traffic assumed hidden behind compute (GPU targets and a local GPU).
HOST_OVERLAP = 0.5

#: Data-sheet figures: dense TF32 matrix FLOP/s (XLA's default for f32 dots on these GPUs),
#: HBM bandwidth, PCIe (Gen5 x16 on H100 SXM, Gen4 x16 on A100) at about 80% of its peak.
GPU_ROOFLINES: Mapping[str, Roofline] = {
    "h100": Roofline("h100", 494.7e12, 3.35e12, 50e9, HOST_OVERLAP),
    "h200": Roofline("h200", 494.7e12, 4.8e12, 50e9, HOST_OVERLAP),
    "a100": Roofline("a100", 156e12, 2.039e12, 25e9, HOST_OVERLAP),
}
#: Host link assumed for a target config of the user's own (PCIe Gen4 x16 at about 80%).
CUSTOM_HOST_BYTES_PER_SECOND = 25e9


def cost(fn: Callable[..., Any], *args: Any) -> tuple[float, float]:
  """``(flops, bytes accessed)`` of ``jax.jit(fn)`` for ``args`` (arrays or
  ``ShapeDtypeStruct``s) by XLA's cost analysis of the program compiled on the local
  backend (fusions counted once), each scan's body counted once per iteration: XLA's
  analysis counts a loop's body once."""
  return _loop_cost(jax.make_jaxpr(fn)(*args))


def _loop_cost(closed: jex_core.ClosedJaxpr) -> tuple[float, float]:
  """XLA's figures for ``closed``, plus ``length - 1`` more runs of each scan body (and
  of the scans inside it, counted the same way)."""
  flops, touched = _xla_cost(closed)
  for eqn in _outer_scans(closed.jaxpr.eqns):
    body = eqn.params["jaxpr"]
    once, every = _xla_cost(body), _loop_cost(body)
    flops += eqn.params["length"] * every[0] - once[0]
    touched += eqn.params["length"] * every[1] - once[1]
  return flops, touched


def _outer_scans(eqns: Any) -> Iterator[Any]:
  """The scan equations of ``eqns`` and of the jaxprs nested in them, not inside a scan."""
  for eqn in eqns:
    if eqn.primitive.name == "scan":
      yield eqn
      continue
    for jaxpr in _compat.param_jaxprs(eqn.params):
      yield from _outer_scans(jaxpr.eqns)


def _xla_cost(closed: jex_core.ClosedJaxpr) -> tuple[float, float]:
  args = [jax.ShapeDtypeStruct(v.aval.shape, v.aval.dtype) for v in closed.jaxpr.invars]
  analysis = jax.jit(jex_core.jaxpr_as_fun(closed)).lower(*args).compile().cost_analysis()
  if isinstance(analysis, (list, tuple)):  # older jax: one dict per program
    analysis = analysis[0] if analysis else {}
  analysis = analysis or {}
  return float(analysis.get("flops", 0.0)), float(analysis.get("bytes accessed", 0.0))


#: A run shorter than this (seconds) is mostly the call's own cost (a GPU's launch and
#: sync, tens of microseconds), so ``measured_rate`` grows the problem until a run lasts it.
LEAST_RUN_SECONDS = 2e-3


def measured_rate(run_seconds: Callable[[int], float], work: Callable[[int], float],
                  size: int, largest: int) -> float:
  """Work per second (FLOP/s, bytes/s) of a program measured at ``size``, doubled (up to
  ``largest``) while a run lasts less than ``LEAST_RUN_SECONDS``. Grown, the rate is the
  last doubling's: extra work over extra seconds, so a fixed cost per call cancels; where
  the doubling added less than half again to the time (the call's cost still dominates,
  or noise), the work over the time of the larger run, a lower bound.

  Args:
    run_seconds: the least wall time of one run at a size (seconds).
    work: the work done at a size (FLOPs or bytes).
    size: the first size measured.
    largest: the largest size measured.
  """
  seconds = max(run_seconds(size), 1e-9)
  while seconds < LEAST_RUN_SECONDS and size * 2 <= largest:
    grown = max(run_seconds(size * 2), 1e-9)
    rate = (work(size * 2) - work(size)) / (grown - seconds) if grown > 1.5 * seconds else 0.0
    size, seconds = size * 2, grown
    if seconds >= LEAST_RUN_SECONDS or size * 2 > largest:
      return max(rate, work(size) / seconds)
  return work(size) / seconds


@functools.cache
def local_roofline() -> Roofline:
  """The local backend's rates, measured (``measured_rate``: the best of 5 runs, the
  problem grown until its runs outlast the call's own cost): an f32 matrix product from
  1024^3 up to 8192^3 (FLOP/s), an f32 copy-with-add from 64 MiB up to 1 GiB (bytes/s)
  and, on a GPU, that array's copy to pinned host memory (the offload link, bytes/s)."""

  def best(fn: Callable[[jax.Array], Any], x: jax.Array) -> float:
    return best_step_seconds([jax.jit(fn)], (x,), rounds=1, runs=5)[0]

  def square(n: int) -> jax.Array:
    return jnp.ones((n, n), jnp.float32)

  def vector(n: int) -> jax.Array:
    return jnp.ones((n,), jnp.float32)

  flops = measured_rate(lambda n: best(lambda x: x @ x, square(n)),
                        lambda n: 2.0 * n**3, 1024, 8192)
  bandwidth = measured_rate(lambda n: best(lambda x: x + 1.0, vector(n)),
                            lambda n: 8.0 * n, 2**24, 2**28)  # 4 bytes read, 4 written
  if jax.default_backend() != "gpu":
    return Roofline(jax.default_backend(), flops, bandwidth)

  def to_host_seconds(n: int) -> float:  # one direction; offload's traffic is as much back
    v = vector(n)
    return best_step_seconds(
        [jax.jit(lambda x: x, out_shardings=v.sharding.with_memory_kind("pinned_host"))],
        (v,), rounds=1, runs=5)[0]

  try:
    host = measured_rate(to_host_seconds, lambda n: 4.0 * n, 2**24, 2**28)
  except (ValueError, RuntimeError):  # no pinned host memory here: no offload
    return Roofline(jax.default_backend(), flops, bandwidth)
  return Roofline(jax.default_backend(), flops, bandwidth, host, HOST_OVERLAP)


def roofline_for(target: str | Target | None) -> Roofline:
  """The roofline of a GPU target (a built-in name or anything ``get_target`` accepts), or
  the local device's for None. A config of the user's own gives its memory bandwidth and,
  for FLOP/s, its CUDA cores' f32 rate (``core_count * fpus_per_core * 2 *
  clock_rate_ghz``: a config carries no tensor-core figure)."""
  if target is None:
    return local_roofline()
  resolved = get_target(target)
  assert resolved is not None
  if resolved.name in GPU_ROOFLINES:
    return GPU_ROOFLINES[resolved.name]
  facts = {k: config_number(resolved.config, k)
           for k in ("core_count", "fpus_per_core", "clock_rate_ghz", "memory_bandwidth")}
  flops = facts["core_count"] * facts["fpus_per_core"] * 2 * facts["clock_rate_ghz"] * 1e9
  if not (flops > 0 and facts["memory_bandwidth"] > 0):
    raise InvalidArgumentError(
        f"The target config {resolved.name!r} gives no core_count, fpus_per_core, "
        "clock_rate_ghz and memory_bandwidth in gpu_device_info, which fit's time model "
        "needs (the roofline: FLOP/s and memory bandwidth).")
  return Roofline(resolved.name, flops, facts["memory_bandwidth"],
                  CUSTOM_HOST_BYTES_PER_SECOND, HOST_OVERLAP)

