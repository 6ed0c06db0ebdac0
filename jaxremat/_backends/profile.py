"""Profile a traced chain: per layer the bytes of its output, residuals and cotangent, and FLOPs."""

from __future__ import annotations

import dataclasses
from collections.abc import Collection, Sequence
from typing import Any

import jax

from jaxremat._backends.base import Backend
from jaxremat._backends.buffers import CpuBuffers, StartBuffers, scaled
from jaxremat._backends.measure import memory_stats
from jaxremat._backends.registry import backend_for
from jaxremat._backends.targets import Target, compile_on_target
from jaxremat._jaxpr import compat as _compat
from jaxremat._jaxpr.layer_vjp import flops, forward_and_backward
from jaxremat._jaxpr.residuals import LayerResiduals, elementwise, residuals, without_checkpoints
from jaxremat._jaxpr.signature import layer_signature
from jaxremat._jaxpr.trace import Layer, TracedChain
from jaxremat._model.chain import Chain


@dataclasses.dataclass(frozen=True)
class Buffers:
  """Per layer, the separate buffers behind the chain's byte counts (for ``estimate``).

  Attributes:
    residuals: bytes of each residual the layer computes and saves.
    inputs: bytes of each saved input that no earlier layer already saves.
    param_grads: bytes of each parameter gradient the layer's backward writes (a
      parameter read by several layers counts for the first).
    start: buffers XLA allocates for the layer's backward before it runs (``StartBuffers``);
      empty on backends without any.
    elementwise: per layer, whether its every operation is elementwise and fusible (a
      ReLU): XLA then writes its input cotangent over its output cotangent (one buffer).
    saves_output: per layer, whether its residuals include its output ``x_i`` (then
      counted as its residual, and as the next layer's input nowhere else).
    cpu: what XLA's CPU backend adds besides (``CpuBuffers``); None on other backends.
  """

  residuals: tuple[tuple[int, ...], ...]
  inputs: tuple[tuple[int, ...], ...]
  param_grads: tuple[tuple[int, ...], ...]
  start: tuple[StartBuffers, ...] = ()
  elementwise: tuple[bool, ...] = ()
  saves_output: tuple[bool, ...] = ()
  cpu: CpuBuffers | None = None

  def per_device(self, act: Sequence[float], res: Sequence[float],
                 param_grads: tuple[tuple[int, ...], ...]) -> Buffers:
    """Bytes on one device, where activation ``x_i`` holds fraction ``act[i]`` of its
    bytes there and layer ``i``'s residuals ``res[i - 1]``; ``param_grads`` per device."""
    return dataclasses.replace(
        self, param_grads=param_grads,
        residuals=tuple(tuple(scaled(b, res[i]) for b in r) for i, r in enumerate(self.residuals)),
        inputs=tuple(tuple(scaled(b, act[i]) for b in r) for i, r in enumerate(self.inputs)),
        start=tuple(s.per_device(act[i], res[i]) for i, s in enumerate(self.start)),
        cpu=self.cpu.per_device(act, res) if self.cpu else None)


@dataclasses.dataclass(frozen=True)
class Profile:
  chain: Chain
  buffers: Buffers


def profile(traced: TracedChain, calibrate: bool | Collection[int] = False,
            backend: str | Backend | None = None, target: Target | None = None) -> Profile:
  """Measures the chain of ``traced`` (bytes are dtype-aware; FLOPs from XLA's cost model).

  ``backend`` (a platform name or a ``Backend``; default: JAX's default backend) picks
  what XLA is modelled to keep and add (``registry.backend_for``).

  With ``calibrate``, each layer's forward and backward is also compiled alone (or only
  the layers whose indices ``calibrate`` lists), for ``target`` when given; what
  XLA's temp needs beyond the layer's residuals becomes its workspace ``w_i``. (A temp
  below the residuals does not lower ``b_i``: alone, a layer can recompute cheap
  residuals from its input, which in the whole program is not held.)
  """
  rules = backend_for(backend) if backend is None or isinstance(backend, str) else backend
  layers = traced.layers
  n = len(layers)
  param_vars = set(traced.param_vars)
  batch_vars = set(traced.batch_vars)
  # Invariants a cotangent flows into: the parameters and anything computed from them.
  grad_invariants = param_vars | set(traced.prelude_outputs)

  first_inputs = tuple(v for v in layers[0].invariants if v in batch_vars)
  act = [_bytes(first_inputs)] + [_bytes(layer.outputs) for layer in layers[:-1]]
  act.append(_bytes(layers[-1].side_outputs))
  cot = [0] + [_bytes(v for v in layer.outputs if _compat.is_float(v.aval))
               for layer in layers[:-1]]
  cot.append(_bytes(v for v in layers[-1].side_outputs if _compat.is_float(v.aval)))

  inputs = [first_inputs if i == 0 else layer.inputs for i, layer in enumerate(layers)]
  found = _profile_layers(rules, layers, inputs, grad_invariants)
  extras = [e for e, _, _ in found]
  saved = [r for _, r, _ in found]
  res = [r.total for r in saved]
  own = [r.own_input for r in saved]
  saved_inputs = [set(r.own_input_vars) for r in saved]
  # A value saved both by layer i (its output) and by layer i+1 (its input) is one
  # buffer: count it once, as layer i's.
  for i in range(n - 1):
    shared = saved[i].own_output_vars & saved[i + 1].own_input_vars
    overlap = _bytes(shared)
    res[i + 1] -= overlap
    own[i + 1] -= overlap
    saved_inputs[i + 1] -= shared
  seen_params: set = set()
  param_grads = []
  for layer in layers:
    mine = [v for v in layer.invariants
            if v in param_vars and v not in seen_params and _compat.is_float(v.aval)]
    seen_params.update(mine)
    param_grads.append(tuple(_compat.aval_bytes(v.aval) for v in mine))
  added = rules.chain_buffers(extras, cot)
  start = added.start
  work = list(added.workspace) or [0] * n
  for i, layer in enumerate(layers):  # the user's own checkpoints: recomputed in backward
    work[i] += _recomputed_bytes(rules, layer, inputs[i], grad_invariants, i > 0, saved[i])
  buffers = Buffers(
      residuals=tuple(r.computed for r in saved),
      inputs=tuple(tuple(_compat.aval_bytes(v.aval) for v in s) for s in saved_inputs),
      param_grads=tuple(param_grads),
      start=start,
      elementwise=tuple(elementwise(layer) for layer in layers),
      saves_output=tuple(bool(r.own_output_vars) for r in saved),
      cpu=added.cpu)
  if calibrate:
    for i, layer in enumerate(layers):
      if calibrate is not True and i not in calibrate:
        continue
      temp = backward_temp_bytes(layer, inputs[i], grad_invariants, i > 0, target)
      modelled = start[i].total_bytes if start else 0  # walked by the estimate instead
      work[i] = max(0, temp - (res[i] - own[i]) - modelled)
  chain = Chain(
      act_bytes=act,
      res_bytes=res,
      cot_bytes=cot,
      input_res_bytes=own,
      workspace_bytes=work,
      flops=[f for _, _, f in found],
      names=[layer.name for layer in layers],
  )
  return Profile(chain, buffers)


def _profile_layers(rules: Backend, layers: Sequence[Layer], inputs: Sequence[tuple],
                    grad_invariants: set) -> list[tuple[Any, LayerResiduals, int]]:
  """Per layer, the backend's extras, its residuals and its FLOPs. Layers of equal
  ``layer_signature`` (a transformer's repeated blocks) are profiled once; the others'
  residual variables are mapped from it by position."""
  found: dict[Any, tuple[Any, LayerResiduals, int, Layer, tuple]] = {}
  out = []
  for i, layer in enumerate(layers):
    key = layer_signature(layer, inputs[i], grad_invariants, i > 0)
    if key is None or key not in found:
      extras, saved = _kept(rules, layer, inputs[i], grad_invariants, i > 0)
      entry = (extras, saved, flops(layer, inputs[i]), layer, inputs[i])
      if key is not None:
        found[key] = entry
    else:
      entry = found[key]
    extras, saved, layer_flops, like, like_inputs = entry
    out.append((extras, _renamed(saved, like, like_inputs, layer, inputs[i]), layer_flops))
  return out


def _recomputed_bytes(rules: Backend, layer: Layer, inputs: tuple, grad_invariants: set,
                      differentiate_inputs: bool, saved: LayerResiduals) -> int:
  """Bytes a layer holding the user's own ``jax.checkpoint`` (an ``nn.remat`` block) holds
  in its backward beyond its residuals: what the checkpointed body's VJP keeps, made again
  there (the layer's residuals without its checkpoints, less its residuals)."""
  whole = without_checkpoints(layer)
  if whole is None:
    return 0
  _, kept = _kept(rules, whole, inputs, grad_invariants, differentiate_inputs)
  return max(0, kept.total - saved.total)


def _kept(rules: Backend, layer: Layer, inputs: tuple, grad_invariants: set,
          differentiate_inputs: bool) -> tuple[Any, LayerResiduals]:
  """The backend's extras of ``layer`` and its residuals as the backend keeps them."""
  extras = rules.layer_extras(layer, inputs, grad_invariants, differentiate_inputs)
  saved = residuals(layer, inputs, grad_invariants, differentiate_inputs,
                    keep=rules.keep_rule(extras)).plus(rules.extra_residuals(extras))
  return extras, saved


def _renamed(saved: LayerResiduals, like: Layer, like_inputs: tuple, layer: Layer,
             inputs: tuple) -> LayerResiduals:
  """``saved`` (the residuals of ``like``) with its variables those of ``layer`` at the
  same positions."""
  if like is layer:
    return saved
  ins = dict(zip(dict.fromkeys([*like_inputs, *like.invariants]),
                 dict.fromkeys([*inputs, *layer.invariants])))
  outs = dict(zip(dict.fromkeys([*like.outputs, *like.side_outputs]),
                  dict.fromkeys([*layer.outputs, *layer.side_outputs])))
  return dataclasses.replace(saved, own_input_vars=frozenset(ins[v] for v in saved.own_input_vars),
                             own_output_vars=frozenset(outs[v] for v in saved.own_output_vars))


def _bytes(variables) -> int:
  return sum(_compat.aval_bytes(v.aval) for v in dict.fromkeys(variables))


def backward_temp_bytes(layer: Layer, inputs, grad_invariants, differentiate_inputs: bool,
                        target: Target | None = None) -> int:
  """XLA's temp bytes for the layer's forward and backward compiled alone (for
  ``target``, deviceless; by default on JAX's default backend, under its compiler
  options).

  The program takes the layer's inputs and its output cotangents and returns the
  gradients, so its temp holds what the layer's backward needs beyond them: the
  residuals as XLA keeps them (after fusion) and any transient workspace.
  """
  step, args, cts = forward_and_backward(layer, inputs, grad_invariants, differentiate_inputs)
  if target is not None:
    return int(memory_stats(compile_on_target(step, (args, cts), target)).temp_size_in_bytes)
  compiled = jax.jit(step).lower(args, cts).compile(
      compiler_options=backend_for().compiler_options() or None)
  return int(memory_stats(compiled).temp_size_in_bytes)
