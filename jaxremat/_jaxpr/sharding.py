"""Per-device bytes for a model whose params or batch are sharded over several devices.

Tracing sees global shapes; XLA's compiled statistics of a sharded program are per
device. A sharded input contributes the bytes of one shard. For the activations, the
forward pass (each layer under ``jax.vjp``) is compiled once with the inputs' shardings
and the shardings XLA propagates to each layer output and residual are read back: a
layer's output and cotangent scale by its output's per-device fraction, the residuals
it computes by theirs, the residual that is its own input by the input's. Buffers of
collectives (an all-gathered input kept for the backward) are not modelled."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import jax

from jaxremat._jaxpr import compat as _compat
from jaxremat._jaxpr.layer_vjp import differentiable
from jaxremat._jaxpr.trace import TracedChain
from jaxremat._model.chain import Chain

if TYPE_CHECKING:  # the backends' profile, which this layer scales but does not make
  from jaxremat._backends.profile import Profile


def is_sharded(tree: Any) -> bool:
  """True when some leaf is a jax.Array spread over more than one device."""
  return any(isinstance(x, jax.Array) and len(x.sharding.device_set) > 1
             for x in jax.tree_util.tree_leaves(tree))


def device_bytes(x: Any) -> int:
  """Bytes of the largest shard of ``x`` on one device (all of ``x`` if not a jax.Array)."""
  if not isinstance(x, jax.Array):
    return _compat.aval_bytes(x)
  shape = x.sharding.shard_shape(x.shape)
  return _compat.aval_bytes(jax.ShapeDtypeStruct(shape, x.dtype))


def per_device_profile(traced: TracedChain, prof: Profile, flat_inputs: Sequence[Any]) -> Profile:
  """``prof`` (global bytes) as bytes per device, for inputs sharded as ``flat_inputs``."""
  act_f, res_f = fractions(traced, flat_inputs)
  chain = prof.chain
  n = chain.n

  def scale(v, r):
    return int(round(v * r))

  act = [scale(a, act_f[i]) for i, a in enumerate(chain.act_bytes)]
  cot = [scale(g, act_f[i]) for i, g in enumerate(chain.cot_bytes)]
  own = [scale(chain.input_res_bytes[i], act_f[i]) for i in range(n)]
  res = [scale(chain.res_bytes[i] - chain.input_res_bytes[i], res_f[i]) + own[i] for i in range(n)]
  work = [scale(w, res_f[i]) for i, w in enumerate(chain.workspace_bytes)]
  leaf = dict(zip(traced.param_vars, flat_inputs))
  seen: set = set()
  grads = []
  for layer in traced.layers:
    mine = [v for v in layer.invariants if v in leaf and v not in seen and _compat.is_float(v.aval)]
    seen.update(mine)
    grads.append(tuple(device_bytes(leaf[v]) for v in mine))
  buffers = prof.buffers.per_device(act_f, res_f, tuple(grads))
  chain = Chain(act, res, cot_bytes=cot, input_res_bytes=own, workspace_bytes=work,
                flops=chain.flops, names=chain.names)
  return dataclasses.replace(prof, chain=chain, buffers=buffers)


def fractions(traced: TracedChain, flat_inputs: Sequence[Any]) -> tuple[list[float], list[float]]:
  """The fraction of its bytes one device holds: per activation ``x_0..x_n``, and per
  layer of the residuals it computes (one compile of the forward pass, each layer under
  ``jax.vjp``, with the inputs' shardings; read from XLA's output shardings)."""
  layers = traced.layers
  batch_vars = set(traced.batch_vars)
  grad_invariants = set(traced.param_vars) | set(traced.prelude_outputs)
  first = [v for v in layers[0].invariants if v in batch_vars]
  outs = [list(layer.outputs) for layer in layers[:-1]] + [list(layers[-1].side_outputs)]
  base = [*traced.input_vars, *traced.const_vars]
  prelude = _compat.sub_function(traced.prelude, base, traced.prelude_outputs)
  vjps = [differentiable(layer, first if i == 0 else layer.inputs, grad_invariants, i > 0)
          for i, layer in enumerate(layers)]

  def forward(*args):
    env = dict(zip(base, args))
    env.update(zip(traced.prelude_outputs, prelude(*args)))
    acts, residuals = [], []
    for (vjp, in_vars, out_vars), want in zip(vjps, outs):
      ins = [env[v] for v in in_vars]
      values, vjp_fn = vjp(*ins)
      env.update(zip(out_vars, values))
      acts.append([env[v] for v in want])
      residuals.append([r for r in jax.tree_util.tree_leaves(vjp_fn)
                        if not any(r is x for x in ins) and getattr(r, "ndim", 0) > 0])
    return acts, residuals

  compiled = jax.jit(forward).lower(*flat_inputs, *traced.consts).compile()
  acts, res = jax.eval_shape(forward, *flat_inputs, *traced.consts)
  act_sh, res_sh = compiled.output_shardings
  act_f = [_ratio([(x, x.sharding.shard_shape(x.shape)) for x in
                   (dict(zip(traced.input_vars, flat_inputs))[v] for v in first)])]
  act_f += [_ratio([(x, sh.shard_shape(x.shape)) for x, sh in zip(a, s)])
            for a, s in zip(acts, act_sh)]
  res_f = [_ratio([(x, sh.shard_shape(x.shape)) for x, sh in zip(r, s)])
           for r, s in zip(res, res_sh)]
  return act_f, res_f


def _ratio(pairs) -> float:
  total = sum(_compat.aval_bytes(x) for x, _ in pairs)
  here = sum(_compat.aval_bytes(jax.ShapeDtypeStruct(shape, x.dtype)) for x, shape in pairs)
  return here / total if total else 1.0


def tree_device_bytes(tree: Any, floats_only: bool = False) -> int:
  """Bytes per device of a pytree of (possibly sharded) arrays."""
  return sum(device_bytes(x) for x in jax.tree_util.tree_leaves(tree)
             if not floats_only or _compat.is_float(x))

