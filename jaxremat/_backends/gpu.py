"""XLA's GPU backend: what it keeps for a backward pass, where it differs from the jaxpr.

XLA's GPU fusion writes to memory only the values a fusion must hand on: outputs of
library calls and reductions (matmuls, convolutions, sums), values a library call
reads (its operands), and the step's outputs. An elementwise intermediate that only
other elementwise ops or reductions read is never written: the backward's fusions
recompute it from the written values it derives from. So a tanh-GELU keeps its input
(a matmul's output) and its output (the next matmul's operand), not its ``tanh``; a
softmax keeps the scores and the probabilities, not the ``exp``; BatchNorm keeps the
convolution's output and the ReLU's output, not the centred or normalised values.

During a layer's backward the written intermediates (a cotangent a matmul or
convolution reads, such as the gradient of an MLP's hidden layer) need room too: the
largest such intermediate is the layer's workspace ``w_i``. A max-pool's gradient adds
a zero-filled scatter target and argmax indices (``pool_buffers``).

Read off the buffer assignments of an H100 (jax 0.11.2;
bench/results/gpu-h100): without remat these rules take the ViT from +63%
to +0.5% of XLA's compiled footprint, the GPT from +19% to −3.4%, ResNet-18 from +42%
to −3.9% (``bench/gpu_offline.py``).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import jax

from jaxremat._backends.buffers import BackendBuffers, StartBuffers
from jaxremat._jaxpr import compat as _compat
from jaxremat._jaxpr.layer_vjp import forward_and_backward
from jaxremat._jaxpr.residuals import KeepRule
from jaxremat._jaxpr.trace import Layer

#: Primitives XLA fuses into their consumer on GPU: those it fuses on every backend and
#: a few more the CPU model does not count on.
FUSIBLE = _compat.FUSIBLE_PRIMITIVES | {
    "copy", "copy_p", "cos", "erf", "log1p", "pow", "sin", "stop_gradient", "xor"}

#: Consumers that read a fused producer without it being written: reductions and
#: layout changes take their operand as a fusion input.
_FUSING_CONSUMERS = frozenset({
    "reduce_sum", "reduce_max", "reduce_min", "reduce_prod", "argmax", "argmin", "transpose",
    "concatenate", "pad",
})

def fusible(eqn) -> bool:
  """True when XLA fuses ``eqn`` into its consumer: an elementwise, broadcast or
  reshape primitive, or a call (``jit``, ``custom_jvp``) of only such primitives."""
  return _compat.fusible(eqn, FUSIBLE)


class _Uses:
  """Producers and consumers of each value of a jaxpr."""

  def __init__(self, jaxpr):
    self.producer = {v: e for e in jaxpr.eqns for v in e.outvars}
    self.consumers: dict = {}
    self.last_use: dict = {}
    for k, eqn in enumerate(jaxpr.eqns):
      for v in eqn.invars:
        if not isinstance(v, _compat.Literal):
          self.consumers.setdefault(v, []).append(eqn)
          self.last_use[v] = k

  def written(self, v) -> bool:
    """True when XLA writes ``v`` to memory: made by an unfused op, or read by one."""
    eqn = self.producer.get(v)
    if eqn is None or not fusible(eqn):
      return True
    return any(not fusible(c) and c.primitive.name not in _FUSING_CONSUMERS
               for c in self.consumers.get(v, ()))


def kept_values(jaxpr, res_atoms, out_atoms) -> list:
  """The values XLA's GPU backend keeps for the backward in place of ``res_atoms``
  (the residuals of ``jaxpr``, which computes a layer's outputs ``out_atoms`` and its
  residuals): each residual that is written, else the written values it is fused from.
  """
  uses = _Uses(jaxpr)
  held = set(jaxpr.invars) | set(jaxpr.constvars)
  held |= {v for v in out_atoms if not isinstance(v, _compat.Literal)}
  memo: dict = {}

  def kept(v) -> list:
    if isinstance(v, _compat.Literal):
      return []
    if v not in memo:
      written = v in held or uses.written(v)
      memo[v] = [v] if written else [k for u in uses.producer[v].invars for k in kept(u)]
    return memo[v]

  return [k for atom in res_atoms for k in kept(atom)]


#: Ops that are bitcasts on GPU: their result is their operand's buffer. (A transpose is
#: a copy: a kernel gradient a matmul writes as ``[out, in]`` and transposes into its
#: gradient buffer takes temp, 128 MiB a layer in the H100 MLP's buffer assignment.)
_LAYOUT = frozenset({"reshape", "squeeze", "expand_dims"})


def backward_workspace_bytes(step_jaxpr, cotangents) -> int:
  """The largest intermediate XLA's GPU backend writes during a layer's backward
  (bytes): a value computed from the output cotangents ``cotangents`` (invars of the
  layer's forward-and-backward ``step_jaxpr``) that is written and is not a gradient the
  step returns."""
  jaxpr = getattr(step_jaxpr, "jaxpr", step_jaxpr)
  backward = _compat.input_dependent(jaxpr, cotangents)
  uses = _Uses(jaxpr)
  returned = {v for v in jaxpr.outvars if not isinstance(v, _compat.Literal)}
  for eqn in reversed(jaxpr.eqns):  # a gradient before a bitcast is the gradient
    if eqn.primitive.name in _LAYOUT and all(v in returned for v in eqn.outvars):
      operand = eqn.invars[0]
      if all(c.primitive.name in _LAYOUT for c in uses.consumers.get(operand, ())):
        returned.add(operand)
  sizes = [_compat.aval_bytes(v.aval) for eqn in jaxpr.eqns for v in eqn.outvars
           if v in backward and v not in returned and v in uses.last_use and uses.written(v)]
  return max(sizes, default=0)


def pool_buffers(step_jaxpr) -> tuple[int, int]:
  """``(zeros, indices)`` bytes XLA's GPU backend adds for the max-pools of a layer's
  forward-and-backward ``step_jaxpr``. Its argmax writes one ``s32`` index per operand
  dimension and pooled element, in the backward just before the scatter that reads it:
  workspace of the pool's backward. The scatter's zero-filled target of the operand's
  shape is one buffer with the zeros the ReLU before the pool compares against (XLA
  merges equal constants), so it is written in the forward and lives until the pool's
  backward."""
  jaxpr = getattr(step_jaxpr, "jaxpr", step_jaxpr)
  zeros = indices = 0
  for eqn in _compat.all_eqns(jaxpr.eqns):
    if eqn.primitive.name in _compat.POOL_GRADIENT_PRIMITIVES:
      operand = _compat.array_aval(eqn.outvars[0])
      pooled = _compat.array_aval(eqn.invars[0])
      zeros += _compat.aval_bytes(operand)
      indices += len(operand.shape) * int(pooled.size) * _compat.INDEX_BYTES
  return zeros, indices


@dataclasses.dataclass(frozen=True)
class GpuLayer:
  """What XLA's GPU backend adds to one layer's backward (bytes).

  Attributes:
    workspace: the largest intermediate it writes (``backward_workspace_bytes``).
    pool_zeros: its max-pools' zero-filled scatter targets (``pool_buffers``).
    pool_indices: its max-pools' argmax indices (``pool_buffers``).
  """

  workspace: int
  pool_zeros: int
  pool_indices: int


@dataclasses.dataclass(frozen=True)
class GpuBackend:
  """XLA's GPU backend: its fusion keeps only written values; workspace and pools added."""

  name: str = "gpu"

  def compiler_options(self) -> dict[str, str | bool]:
    """None needed: XLA's GPU pipeline keeps remat's barriers."""
    return {}

  def layer_extras(self, layer: Layer, inputs, grad_invariants,
                   differentiate_inputs: bool) -> GpuLayer:
    """The layer backward's workspace and its max-pools' buffers."""
    step, args, cts = forward_and_backward(layer, inputs, grad_invariants, differentiate_inputs)
    closed = jax.make_jaxpr(step)(args, cts)
    n_cts = len(jax.tree_util.tree_leaves(cts))
    invars = closed.jaxpr.invars
    zeros, indices = pool_buffers(closed)
    return GpuLayer(workspace=backward_workspace_bytes(closed, invars[len(invars) - n_cts:]),
                    pool_zeros=zeros, pool_indices=indices)

  def keep_rule(self, extras: GpuLayer | None = None) -> KeepRule:
    """``kept_values``: the written values."""
    return kept_values

  def extra_residuals(self, extras: GpuLayer) -> tuple[int, ...]:
    """None (bytes)."""
    return ()

  def chain_buffers(self, extras: Sequence[GpuLayer], cot_bytes: Sequence[int]) -> BackendBuffers:
    """The pools' zeros as start buffers; workspace and argmax indices as workspace."""
    return BackendBuffers(
        start=tuple(StartBuffers(until_backward=layer.pool_zeros) for layer in extras),
        workspace=tuple(layer.workspace + layer.pool_indices for layer in extras))
