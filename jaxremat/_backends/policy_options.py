"""Per-layer options for policy plans, with their bytes and seconds (issue 24).

For each layer the candidates are: keep every residual; recompute them all from the
layer's input; keep the outputs of its matrix products (``dots``, ``dots-no-batch``);
keep (or, on a GPU target, offload to host memory) the outputs of its costliest products
only, chosen by recompute FLOPs per byte (a knapsack frontier: prefixes of that order).
Several consecutive layers may also be recomputed as one group (model R's segments).

Bytes: the layer's residuals ``b_i``, own-input part ``e_i``, workspace ``w_i`` and
cotangents come from the planner's profile (what the backend models XLA to keep); what a
policy keeps of them is JAX's own list of saved residuals
(``jax.ad_checkpoint``'s ``saved_residuals``) of the checkpointed layer. Seconds: what
the option adds to the layer's forward-and-backward by XLA's cost analysis of the
lowered program (FLOPs, bytes accessed), through a ``Roofline``; offload adds its
traffic at the target's host-link bandwidth. Layers of equal structure are measured once.
"""

from __future__ import annotations

import math
from collections.abc import Hashable
from typing import Any

import jax

from jaxremat._backends.roofline import Roofline, cost
from jaxremat._jaxpr import compat as _compat
from jaxremat._jaxpr.emit import policy_segment
from jaxremat._jaxpr.layer_vjp import spec
from jaxremat._jaxpr.signature import layer_signature
from jaxremat._jaxpr.trace import TracedChain
from jaxremat._model.chain import Chain
from jaxremat._model.policy_plan import (DOTS, DOTS_NO_BATCH, KEEP, NAMES, RECOMPUTE, Group,
                                         GroupCost, Option)

NAME_OPTIONS = 3  # prefixes of the products' knapsack order offered per layer
_PRODUCTS = ("dot_general", "conv_general_dilated")


def group_costs(traced: TracedChain, chain: Chain, roofline: Roofline,
                offload: bool = False, max_group: int | None = None) -> list[GroupCost]:
  """Every candidate group of ``traced``'s chain with its bytes and seconds.

  Args:
    traced: the traced chain (not a graph).
    chain: its profile (``Planner.chain``): bytes per layer as XLA is modelled to keep them.
    roofline: the target's rates.
    offload: offer offload options (a backend with host memory: GPU targets).
    max_group: the most layers one recomputed group may span (default: all).
  """
  n = len(traced.layers)
  grad_invariants = set(traced.param_vars) | set(traced.prelude_outputs)
  cache: dict[tuple[Hashable, Option], tuple[int, float]] = {}
  forward: dict[tuple[Hashable, None], tuple[float, float]] = {}
  per_layer: list[list[GroupCost]] = []
  recompute_seconds = []
  for i, layer in enumerate(traced.layers):
    base = chain.workspace_bytes[i] + chain.cot_bytes[i] + chain.cot_bytes[i + 1]
    b, e, x = chain.res_bytes[i], chain.input_res_bytes[i], chain.act_bytes[i]
    key = layer_signature(layer, layer.inputs, grad_invariants, i > 0)
    options = [GroupCost(Group(i, i + 1, Option(KEEP)), b, base, 0.0)]
    for option in _candidates(traced, i, offload):
      measured_key = (key if key is not None else ("layer", i), option)
      if measured_key not in cache:
        if (key, None) not in forward:
          fn, in_vars, _ = policy_segment(traced, Group(i, i + 1, Option(KEEP)))
          forward[(key, None)] = cost(fn, *map(spec, in_vars))
        cache[measured_key] = _measure(traced, i, option, grad_invariants, roofline,
                                       forward[(key, None)])
      kept, seconds = cache[measured_key]
      host = _offloaded_bytes(traced, i, option)
      seconds += roofline.offload_seconds(host) if host else 0.0
      if not math.isfinite(seconds):
        continue
      stored = x + min(kept, max(b - e, 0))
      options.append(GroupCost(Group(i, i + 1, option), stored,
                               max(b - e - kept, 0) + host + base, seconds, host))
    recompute_seconds.append(next(c.seconds for c in options
                                  if c.group.option.kind == RECOMPUTE))
    per_layer.append(options)
  costs = [c for options in per_layer for c in options]
  span = n if max_group is None else max_group
  for l in range(n):
    held = -chain.input_res_bytes[l]
    transient = 0
    for r in range(l + 1, min(n, l + span)):  # layers l..r, r > l
      held += chain.res_bytes[r - 1]
      for i in (r - 1, r):
        base = chain.workspace_bytes[i] + chain.cot_bytes[i] + chain.cot_bytes[i + 1]
        transient = max(transient, held + (chain.res_bytes[r] if i == r else 0) + base)
      costs.append(GroupCost(Group(l, r + 1, Option(RECOMPUTE)), chain.act_bytes[l],
                             transient, sum(recompute_seconds[l:r + 1])))
  return costs


def _products(traced: TracedChain, i: int) -> list[int]:
  """Positions of layer ``i``'s matrix products, most recompute FLOPs per output byte first."""
  ranked = []
  for k, eqn in enumerate(traced.layers[i].eqns):
    if eqn.primitive.name in _PRODUCTS and _compat.is_float(eqn.outvars[0].aval):
      out = _compat.aval_bytes(eqn.outvars[0].aval)
      if out:
        ranked.append((-_product_flops(eqn) / out, k))
  return [k for _, k in sorted(ranked)]


def _product_flops(eqn: Any) -> float:
  """FLOPs of one ``dot_general`` or ``conv_general_dilated`` equation."""
  out_size = math.prod(eqn.outvars[0].aval.shape)
  lhs, rhs = (v.aval for v in eqn.invars[:2])
  if eqn.primitive.name == "dot_general":
    (contract, _), _ = eqn.params["dimension_numbers"]
    return 2.0 * out_size * math.prod(lhs.shape[d] for d in contract)
  out_feature = eqn.params["dimension_numbers"].rhs_spec[0]
  return 2.0 * out_size * math.prod(rhs.shape) / rhs.shape[out_feature]


def _candidates(traced: TracedChain, i: int, offload: bool) -> list[Option]:
  products = _products(traced, i)
  options = [Option(RECOMPUTE)]
  if not products:
    return options
  options += [Option(DOTS), Option(DOTS_NO_BATCH)]
  m = len(products)
  prefixes = sorted({max(1, m * j // (NAME_OPTIONS + 1)) for j in range(1, NAME_OPTIONS + 1)})
  for p in prefixes:
    if p < m:
      options.append(Option(NAMES, saved=frozenset(products[:p])))
  if offload:
    for p in [*prefixes, m]:
      options.append(Option(NAMES, offloaded=frozenset(products[:p])))
  return options


def _offloaded_bytes(traced: TracedChain, i: int, option: Option) -> int:
  eqns = traced.layers[i].eqns
  return sum(_compat.aval_bytes(v.aval) for k in option.offloaded for v in eqns[k].outvars)


def _measure(traced: TracedChain, i: int, option: Option, grad_invariants: set,
             roofline: Roofline, forward: tuple[float, float]) -> tuple[int, float]:
  """``(bytes kept on the device, seconds added)`` of layer ``i`` under ``option``.

  Bytes: the residuals its VJP saves that are not its arguments (nor offloaded). Seconds:
  the roofline time of what the backward recomputes, the layer's ``forward`` (FLOPs,
  bytes accessed) less the products the option keeps (their FLOPs, and the bytes they
  read and write).
  """
  vjp, args, _ = _vjp(traced, i, option, grad_invariants)

  def residuals(*args: Any) -> list:
    return jax.tree_util.tree_leaves(vjp(*args)[1])

  jaxpr = jax.make_jaxpr(residuals)(*args).jaxpr
  arguments = set(jaxpr.invars)
  kept = sum(_compat.aval_bytes(v.aval) for v in dict.fromkeys(
      v for v in jaxpr.outvars if not isinstance(v, _compat.Literal) and v not in arguments))
  eqns = traced.layers[i].eqns
  if option.kind == NAMES:
    spared = [eqns[k] for k in (*option.saved, *option.offloaded)]
  elif option.kind in (DOTS, DOTS_NO_BATCH):
    spared = [e for e in eqns if e.primitive.name in _PRODUCTS
              and (option.kind == DOTS or _no_batch_dims(e))]
  else:
    spared = []
  flops = forward[0] - sum(_product_flops(e) for e in spared)
  touched = forward[1] - sum(_compat.aval_bytes(v.aval) for e in spared
                             for v in (*e.invars, *e.outvars) if hasattr(v, "aval"))
  seconds = roofline.seconds(max(flops, 0.0), max(touched, 0.0))
  return max(kept - _offloaded_bytes(traced, i, option), 0), seconds


def _no_batch_dims(eqn: Any) -> bool:
  """A product ``dots_with_no_batch_dims_saveable`` saves: a ``dot_general`` without batch
  dimensions."""
  if eqn.primitive.name != "dot_general":
    return False
  (_, _), (lhs_batch, _) = eqn.params["dimension_numbers"]
  return not lhs_batch


def _vjp(traced: TracedChain, i: int, option: Option, grad_invariants: set):
  """``(vjp, args, cts)``: ``vjp(*args) -> (outputs, vjp_fn)`` of layer ``i`` under
  ``option`` (cotangents for its float inputs and parameters), the abstract args and the
  outputs' cotangents."""
  fn, in_vars, out_vars = policy_segment(traced, Group(i, i + 1, option))
  inputs = set(traced.layers[i].inputs) if i > 0 else set()
  diff = [_compat.is_float(v.aval) and (v in inputs or v in grad_invariants) for v in in_vars]

  def vjp(*args: Any) -> Any:
    def f(*d: Any) -> list:
      it = iter(d)
      return fn(*[next(it) if m else a for a, m in zip(args, diff)])
    return jax.vjp(f, *[a for a, m in zip(args, diff) if m])

  cts = [jax.ShapeDtypeStruct(v.aval.shape, v.aval.dtype if _compat.is_float(v.aval)
                              else jax.dtypes.float0) for v in out_vars]
  return vjp, [spec(v) for v in in_vars], cts
