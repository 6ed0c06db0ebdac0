"""Per-layer options for policy plans, with their bytes and seconds (issue 24).

For each layer the candidates are: keep every residual; recompute them all from the
layer's input; keep the outputs of its matrix products (``dots``, ``dots-no-batch``);
keep (or, on a GPU, offload to host memory) the outputs of its costliest products
only, chosen by recompute FLOPs per byte (a knapsack frontier: prefixes of that order).
Several consecutive layers may also be recomputed as one group (model R's segments).

Bytes: the layer's residuals ``b_i``, own-input part ``e_i``, workspace ``w_i`` and
cotangents come from the planner's profile (what the backend models XLA to keep); what a
policy keeps of them is what JAX's partial evaluation saves: the residual outputs of the
checkpointed layer's VJP that are not its arguments. Seconds: the roofline time of what
the backward recomputes, the layer's forward by XLA's cost analysis of its compiled
program (FLOPs, bytes accessed) less the products the option keeps; offload adds its
traffic at the target's host-link bandwidth. Layers of equal structure are measured once.
"""

from __future__ import annotations

import math
from collections.abc import Hashable
from typing import Any

import jax

from jaxremat._backends.roofline import Roofline, cost
from jaxremat._errors import InvalidPlanError
from jaxremat._jaxpr import compat as _compat
from jaxremat._jaxpr import scan as _scan
from jaxremat._jaxpr.emit import policy_segment
from jaxremat._jaxpr.layer_vjp import spec, vjp_of
from jaxremat._jaxpr.scan import ScanPlan
from jaxremat._jaxpr.signature import layer_signature
from jaxremat._jaxpr.trace import Layer, TracedChain
from jaxremat._model.chain import Chain
from jaxremat._model.policy_plan import (
  DOTS,
  DOTS_NO_BATCH,
  KEEP,
  NAMES,
  RECOMPUTE,
  Group,
  GroupCost,
  Option,
)

NAME_OPTIONS = 3  # prefixes of the products' knapsack order offered per layer
_PRODUCTS = ("dot_general", "conv_general_dilated")


def group_costs(costs: OptionCosts) -> list[GroupCost]:
  """Every candidate group of the chain with its bytes and seconds; offload options where
  the roofline has a link to host memory (a GPU target, or a local GPU with pinned host
  memory)."""
  n = len(costs.traced.layers)
  found = [costs.of(Group(i, i + 1, option)) for i in range(n)
           for option in (Option(KEEP), *costs.options(i))]
  found += [costs.of(Group(l, r, Option(RECOMPUTE)))
            for l in range(n) for r in range(l + 2, n + 1)]
  return [c for c in found if math.isfinite(c.seconds)]


class LayerOptions:
  """Bytes kept and seconds added by one layer under an option (``measure``), for a
  chain's layers or a graph's; layers of equal structure are measured once.

  Args:
    traced: the traced layers.
    roofline: the target's rates.
  """

  def __init__(self, traced: TracedChain, roofline: Roofline):
    self.traced, self.roofline = traced, roofline
    self._grad_invariants = set(traced.param_vars) | set(traced.prelude_outputs)
    self._measured: dict[tuple[Hashable, Option], tuple[int, float]] = {}
    self._forward: dict[Hashable, tuple[float, float]] = {}

  def measure(self, i: int, option: Option,
              traced: TracedChain | None = None) -> tuple[int, float]:
    """``(bytes, seconds)`` of layer ``i`` (of ``traced``, by default the layers given)
    under ``option``: the residuals its VJP saves that are not its inputs nor offloaded,
    and the roofline time its backward spends recomputing (see ``_measure``)."""
    traced = traced or self.traced
    layer = traced.layers[i]
    key = layer_signature(layer, layer.inputs, self._grad_invariants, i > 0)
    key = ("layer", i, id(traced)) if key is None else key
    if key not in self._forward:
      fn, in_vars, _ = policy_segment(traced, Group(i, i + 1, Option(KEEP)))
      self._forward[key] = cost(fn, *map(spec, in_vars))
    if (key, option) not in self._measured:
      self._measured[(key, option)] = _measure(traced, i, option, self._grad_invariants,
                                               self.roofline, self._forward[key])
    return self._measured[(key, option)]

  def measure_run(self, group: Group) -> tuple[int, float]:
    """``(bytes, seconds)`` of a graph's layers ``group`` run as one ``jax.checkpoint``
    under its option (one of ``RUN_OPTIONS``): the residuals the run's VJP saves that are
    not its inputs nor offloaded, and the roofline time its backward spends recomputing,
    from XLA's cost analysis of the run compiled whole (its layers fused as in the step,
    not apart). Runs of equal structure are measured once."""
    traced, (l, r) = self.traced, (group.start, group.stop)
    fn, in_vars, out_vars = policy_segment(traced, group)
    made = {v for layer in traced.layers[:l] for e in layer.eqns for v in e.outvars}
    inputs = tuple(v for v in in_vars if v in made)
    eqns = run_eqns(traced, group)
    run = Layer("", eqns, inputs, tuple(v for v in in_vars if v not in made), tuple(out_vars), ())
    key = layer_signature(run, inputs, self._grad_invariants, True)
    key = ("run", l, r, id(traced)) if key is None else ("run", key)
    if key not in self._forward:
      whole, _, _ = policy_segment(traced, Group(l, r, Option(RECOMPUTE)))
      self._forward[key] = cost(whole, *map(spec, in_vars))
    if (key, group.option) not in self._measured:
      vjp = vjp_of(fn, in_vars, inputs, self._grad_invariants, True)
      kept = _saved_bytes(vjp, [spec(v) for v in in_vars]) - _offloaded_bytes(eqns, group.option)
      self._measured[(key, group.option)] = (max(kept, 0), _seconds(
          eqns, group.option, self.roofline, self._forward[key]))
    return self._measured[(key, group.option)]

  def offload(self, group: Group) -> tuple[int, float]:
    """``(bytes, seconds)`` of what ``group`` offloads to host memory and the time moving
    it there and back adds (``inf`` without a host link)."""
    host = _offloaded_bytes(run_eqns(self.traced, group), group.option)
    return host, self.roofline.offload_seconds(host) if host else 0.0

  def options(self, i: int, stop: int | None = None) -> list[Option]:
    """The candidate options beside ``KEEP`` of layer ``i``, or of layers ``i..stop-1``
    run as one (offload where the roofline has a link to host memory)."""
    group = Group(i, stop or i + 1, Option(RECOMPUTE))
    return _candidates(run_eqns(self.traced, group), self.roofline.host_bytes_per_second > 0)


def run_eqns(traced: TracedChain, group: Group) -> tuple:
  """The equations of the group's layers, in order (what its ``NAMES`` positions index)."""
  return tuple(e for layer in traced.layers[group.start:group.stop] for e in layer.eqns)


class OptionCosts(LayerOptions):
  """Bytes and seconds of any group of a traced chain (``of``).

  Args:
    traced: the traced chain (not a graph).
    chain: its profile (``Planner.chain``): bytes per layer as XLA is modelled to keep them.
    roofline: the target's rates.
    scans: the scanned stacks as ``traced`` runs them; a segmented one (each segment
      recomputed in the backward pass) costs one forward pass of recompute when kept.
      Under a policy that keeps its matrix products, a stack runs one iteration per
      segment under that policy (``scan_policy``).
    written: the model as written (``traced`` before its scans were segmented).
  """

  def __init__(self, traced: TracedChain, chain: Chain, roofline: Roofline,
               scans: tuple[ScanPlan, ...] = (), written: TracedChain | None = None):
    super().__init__(traced, roofline)
    self.chain = chain
    self.scans = scans
    self.segmented = frozenset(s.layer for s in scans if s.rematerialised)
    self.written = written or traced

  def _base(self, i: int) -> int:
    """Bytes beside the residuals during layer ``i``'s backward: workspace, cotangents."""
    c = self.chain
    return c.workspace_bytes[i] + c.cot_bytes[i] + c.cot_bytes[i + 1]

  def of(self, group: Group) -> GroupCost:
    """The group's ``GroupCost`` (seconds ``inf`` where an offload has no host link)."""
    c, (l, r) = self.chain, (group.start, group.stop)
    if r - l > 1 and group.option.kind != RECOMPUTE:
      raise InvalidPlanError(f"a chain's group of several layers ({l + 1}..{r}) is recomputed "
                             f"whole; got option {group.option.kind!r} (a graph's may run "
                             "under a policy).")
    if r - l > 1:  # recomputed whole: hold the input, rebuild every residual
      held, transient = -c.input_res_bytes[l], 0
      for i in range(l, r):
        held += c.res_bytes[i]
        transient = max(transient, held + self._base(i))
      return GroupCost(group, c.act_bytes[l], transient,
                       sum(self.of(Group(i, i + 1, Option(RECOMPUTE))).seconds
                           for i in range(l, r)))
    b, e = c.res_bytes[l], c.input_res_bytes[l]
    if scan_policy(group, self.segmented):
      return self._scanned(group)
    if group.option.kind == KEEP:
      seconds = self.measure(l, Option(RECOMPUTE))[1] if l in self.segmented else 0.0
      return GroupCost(group, b, self._base(l), seconds)
    kept, seconds = self.measure(l, group.option)
    host, moved = self.offload(group)
    seconds += moved
    return GroupCost(group, c.act_bytes[l] + min(kept, max(b - e, 0)),
                     max(b - e - kept, 0) + host + self._base(l), seconds, host)

  def _scanned(self, group: Group) -> GroupCost:
    """A scanned stack run one iteration per segment under a policy that keeps its
    matrix products: it holds what the policy keeps of every iteration (bytes as JAX's
    partial evaluation saves them), and its backward recomputes the rest one iteration
    at a time."""
    c, l, kind = self.chain, group.start, group.option.kind
    segments, policies = _scan.layout(self.scans, {l: kind})
    variant = _scan.rewrite(self.written, segments, policies)[0]
    kept, _ = self.measure(l, Option(KEEP), variant)
    _, seconds = self.measure(l, group.option, self.written)
    every, _ = self.measure(l, Option(KEEP), self.written)
    length = next(s.length for s in self.scans if s.layer == l)
    transient = max(every - kept, 0) // length
    return GroupCost(group, c.act_bytes[l] + kept,
                     transient + c.cot_bytes[l] + c.cot_bytes[l + 1], seconds)


def scan_policy(group: Group, segmented: frozenset[int]) -> bool:
  """Whether ``group`` runs a segmented scanned stack under a policy that keeps its matrix
  products, one iteration per segment (``_scan.layout``)."""
  return (group.stop - group.start == 1 and group.start in segmented
          and group.option.kind in (DOTS, DOTS_NO_BATCH))


def _products(eqns: tuple) -> list[int]:
  """Positions of the matrix products among ``eqns``, most recompute FLOPs per output
  byte first."""
  ranked = []
  for k, eqn in enumerate(eqns):
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


def _candidates(eqns: tuple, offload: bool) -> list[Option]:
  options = [Option(RECOMPUTE)]
  if not _spared(eqns, Option(DOTS)):
    return options
  options += [Option(DOTS), Option(DOTS_NO_BATCH)]
  products = _products(eqns)  # those the layer runs itself: named, saved or offloaded
  if not products:
    return options
  m = len(products)
  prefixes = sorted({max(1, m * j // (NAME_OPTIONS + 1)) for j in range(1, NAME_OPTIONS + 1)})
  for p in prefixes:
    if p < m:
      options.append(Option(NAMES, saved=frozenset(products[:p])))
  if offload:
    for p in [*prefixes, m]:
      options.append(Option(NAMES, offloaded=frozenset(products[:p])))
  return options


def _offloaded_bytes(eqns: tuple, option: Option) -> int:
  return sum(_compat.aval_bytes(v.aval) for k in option.offloaded for v in eqns[k].outvars)


def _measure(traced: TracedChain, i: int, option: Option, grad_invariants: set,
             roofline: Roofline, forward: tuple[float, float]) -> tuple[int, float]:
  """``(bytes kept on the device, seconds added)`` of layer ``i`` under ``option``: the
  residuals its VJP saves that are not its arguments (nor offloaded), and ``_seconds``."""
  kept = _saved_bytes(*_vjp(traced, i, option, grad_invariants))
  eqns = traced.layers[i].eqns
  return (max(kept - _offloaded_bytes(eqns, option), 0),
          _seconds(eqns, option, roofline, forward))


def _seconds(eqns: tuple, option: Option, roofline: Roofline,
             forward: tuple[float, float]) -> float:
  """The roofline time of what the backward of ``eqns`` under ``option`` recomputes (none
  under ``KEEP``): their ``forward`` (FLOPs, bytes accessed) less the products the option
  keeps (their FLOPs, and the bytes they read and write)."""
  if option.kind == KEEP:
    return 0.0
  spared = _spared(eqns, option)
  flops = forward[0] - sum(t * _product_flops(e) for e, t in spared)
  touched = forward[1] - sum(t * _compat.aval_bytes(v.aval) for e, t in spared
                             for v in (*e.invars, *e.outvars) if hasattr(v, "aval"))
  return roofline.seconds(max(flops, 0.0), max(touched, 0.0))


def _saved_bytes(vjp: Any, args: list) -> int:
  """Bytes of the residuals ``vjp(*args)`` saves for its backward that are neither its
  arguments nor its outputs (each value once): an output saved for the backward (a
  ``tanh``'s) is held as an output already, where the values crossing a cut are counted."""

  def residuals(*args: Any) -> tuple:
    outputs, vjp_fn = vjp(*args)
    return jax.tree_util.tree_leaves(outputs), jax.tree_util.tree_leaves(vjp_fn)

  closed, (out_shapes, _) = jax.make_jaxpr(residuals, return_shape=True)(*args)
  jaxpr = closed.jaxpr
  outputs, saved = jaxpr.outvars[:len(out_shapes)], jaxpr.outvars[len(out_shapes):]
  held = set(jaxpr.invars) | {v for v in outputs if not isinstance(v, _compat.Literal)}
  return sum(_compat.aval_bytes(v.aval) for v in dict.fromkeys(
      v for v in saved if not isinstance(v, _compat.Literal) and v not in held))


def _spared(eqns: Any, option: Option) -> list[tuple[Any, int]]:
  """The products whose outputs ``option`` keeps (or offloads), each with how many times
  a run of ``eqns`` makes it (a scan body's, once per iteration): the backward does not
  recompute them."""
  if option.kind == NAMES:
    return [(eqns[k], 1) for k in (*option.saved, *option.offloaded)]
  if option.kind not in (DOTS, DOTS_NO_BATCH):
    return []
  return [(e, t) for e, t in _compat.weighted_eqns(eqns)
          if e.primitive.name in _PRODUCTS and _compat.is_float(e.outvars[0].aval)
          and (option.kind == DOTS or _no_batch_dims(e))]


def _no_batch_dims(eqn: Any) -> bool:
  """A product ``dots_with_no_batch_dims_saveable`` saves: a ``dot_general`` without batch
  dimensions."""
  if eqn.primitive.name != "dot_general":
    return False
  (_, _), (lhs_batch, _) = eqn.params["dimension_numbers"]
  return not lhs_batch


def _vjp(traced: TracedChain, i: int, option: Option, grad_invariants: set):
  """``(vjp, args)``: ``vjp(*args) -> (outputs, vjp_fn)`` of layer ``i`` under ``option``
  (cotangents for its float inputs and parameters) and its abstract args."""
  fn, in_vars, _ = policy_segment(traced, Group(i, i + 1, option))
  vjp = vjp_of(fn, in_vars, traced.layers[i].inputs, grad_invariants, i > 0)
  return vjp, [spec(v) for v in in_vars]
