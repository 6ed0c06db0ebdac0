"""Emit the rematerialised function: each non-final segment under its own jax.checkpoint."""

from __future__ import annotations

import collections
from collections.abc import Callable, Sequence
from typing import Any

import jax

from jaxremat._errors import InvalidPlanError
from jaxremat._jaxpr import compat as _compat
from jaxremat._jaxpr.trace import TracedChain
from jaxremat._model.chain import Plan, validate_plan
from jaxremat._model.policy_plan import DOTS, DOTS_NO_BATCH, KEEP, NAMES, Group, PolicyPlan

_Segment = tuple[Callable[..., Any], list, list]  # (function, its input vars, its output vars)


def has_barriers(plan: Plan | PolicyPlan) -> bool:
  """Whether ``emit`` runs some of the model under ``jax.checkpoint(prevent_cse=True)``,
  whose optimization barriers XLA's CPU compiler removes unless told not to: a plan with
  checkpoints (at any level) or a group under a policy. A segmented scan's checkpoints go
  without barriers (``scan.py``)."""
  if isinstance(plan, PolicyPlan):
    return any(g.option.kind != KEEP for g in plan.groups)
  return bool(plan.checkpoints) or any(has_barriers(p) for _, p in plan.inner)


def emit(traced: TracedChain, plan: Plan | PolicyPlan) -> Callable[[Sequence[Any]], list[Any]]:
  """Returns ``run(flat_inputs) -> flat_outputs`` executing ``traced`` under ``plan``.

  Segment ``(l, r]`` evaluates the equations of layers ``l+1..r``; every segment but the
  last runs inside ``jax.checkpoint(prevent_cse=True)``, so only its inputs (the kept
  values and the parameters it reads) are saved for the backward pass and the rest is
  recomputed. The last segment runs plainly: its residuals are needed first anyway. On a
  chain a segment that ``plan.inner`` splits is itself a composition of sub-segments
  with nested checkpoints (a multi-level plan). On a graph (``traced.is_graph``) a
  segment's inputs are the values made before it that it reads, and its outputs the
  values it makes that later layers or the model's result read.
  """
  n = len(traced.layers)
  if isinstance(plan, PolicyPlan):
    plan.validate(n)
    root, root_inputs, root_outputs = _policy_root(traced, plan)
  elif traced.is_graph and plan.is_nested:
    raise InvalidPlanError("a model that is not a chain takes single-level plans (no Plan.inner).")
  else:
    validate_plan(plan, n)
    root, root_inputs, root_outputs = (
        _graph_root(traced, plan) if traced.is_graph else _segment(traced, 0, n, plan))
  base_vars = [*traced.input_vars, *traced.const_vars]
  prelude = (
      _compat.sub_function(traced.prelude, base_vars, traced.prelude_outputs)
      if traced.prelude else None)

  def run(flat_inputs: Sequence[Any]) -> list[Any]:
    env = dict(zip(base_vars, [*flat_inputs, *traced.consts]))
    if prelude is not None:
      env.update(zip(traced.prelude_outputs, prelude(*[env[v] for v in base_vars])))
    env.update(zip(root_outputs, root(*[env[v] for v in root_inputs])))
    return [a.val if isinstance(a, _compat.Literal) else env[a] for a in traced.outvars]

  return run


def _tied(fn: Callable[..., Any], eqns: Sequence[Any], in_vars: list,
          traced: TracedChain) -> Callable[..., Any]:
  """``fn``, with its inputs other than parameters passed through one
  ``optimization_barrier`` first when ``eqns`` draw random bits.

  Random bits depend on a key alone, so XLA's scheduler may draw every layer's bits at
  the start of the step and hold them all (dropout: the bits of every block at once).
  Tied to the segment's activation, a segment's bits are drawn when it runs. A typed key
  goes through the barrier as its key data, wrapped again after it. The barrier passes
  tangents through untouched (``_barrier``): ``optimization_barrier``'s own derivative
  rule makes every operand's tangent concrete, a raw ``uint32`` key's included, and some
  key primitives have no derivative rule (``random_clone``, which ``nn.scan`` applies to
  its rngs).
  """
  if not _compat.draws_random_bits(eqns):
    return fn
  params = set(traced.param_vars)
  tie = [k for k, v in enumerate(in_vars) if v not in params]

  def tied(*args: Any) -> Any:
    values = list(args)
    barred = _barrier([_key_data(values[k]) for k in tie])
    for k, value in zip(tie, barred):
      values[k] = _like(value, args[k])
    return fn(*values)

  return tied


@jax.custom_jvp
def _barrier(values: list[Any]) -> list[Any]:
  """``jax.lax.optimization_barrier``, differentiated as the identity it is: tangents
  pass through (the barrier's own rule makes them concrete, a key's too)."""
  return jax.lax.optimization_barrier(values)


@_barrier.defjvp
def _barrier_jvp(primals: tuple[list[Any]], tangents: tuple[list[Any]]
                 ) -> tuple[list[Any], list[Any]]:
  return _barrier(primals[0]), tangents[0]


def _is_key(x: Any) -> bool:
  return jax.dtypes.issubdtype(getattr(x, "dtype", None), jax.dtypes.prng_key)


def _key_data(x: Any) -> Any:
  """A typed key's data (uint32), else ``x``."""
  return jax.random.key_data(x) if _is_key(x) else x


def _like(value: Any, original: Any) -> Any:
  """``value`` (from ``_key_data(original)``) as ``original``'s type: a key wrapped again."""
  if not _is_key(original):
    return value
  return jax.random.wrap_key_data(value, impl=jax.random.key_impl(original))


def _segment_inputs(layers: Sequence[Any]) -> list:
  """The inputs of a run of chain layers: the first one's inputs, then every invariant."""
  return list(dict.fromkeys([*layers[0].inputs, *(v for layer in layers for v in layer.invariants)]))


def _function(traced: TracedChain, eqns: list, in_vars: list, out_vars: list,
              names: dict[int, str] | None = None) -> Callable[..., Any]:
  """``eqns`` as a function of ``in_vars`` (outputs of equations in ``names`` passed
  through ``checkpoint_name``), tied to its inputs when it draws random bits (``_tied``)."""
  fn = (_compat.named_function(eqns, in_vars, out_vars, names) if names
        else _compat.sub_function(eqns, in_vars, out_vars))
  return _tied(fn, eqns, in_vars, traced)


def _composed(children: list[_Segment], in_vars: list, out_vars: list) -> Callable[..., Any]:
  """Runs ``children`` in order over one environment of values."""
  def composed(*args):
    env = dict(zip(in_vars, args))
    for fn, child_in, child_out in children:
      env.update(zip(child_out, fn(*[env[v] for v in child_in])))
    return [env[v] for v in out_vars]
  return composed


def _segment_outputs(traced: TracedChain, l: int, r: int) -> list:
  layers = traced.layers
  carry = layers[r - 1].outputs if r < len(layers) else ()
  return list(dict.fromkeys([*carry, *(v for layer in layers[l:r] for v in layer.side_outputs)]))


def _segment(traced: TracedChain, l: int, r: int, plan: Plan | None) -> _Segment:
  """The function of chain layers ``l+1..r`` split by ``plan`` (``None``: run plainly)."""
  layers = traced.layers[l:r]
  in_vars = _segment_inputs(layers)
  out_vars = _segment_outputs(traced, l, r)
  if plan is None or (not plan.checkpoints and not plan.inner):
    eqns = [e for layer in layers for e in layer.eqns]
    return _function(traced, eqns, in_vars, out_vars), in_vars, out_vars
  bounds = (l, *plan.checkpoints, r)
  inner = dict(plan.inner)
  children = []
  for k, (a, b) in enumerate(zip(bounds[:-1], bounds[1:])):
    fn, child_in, child_out = _segment(traced, a, b, inner.get(a))
    if k < len(bounds) - 2:
      fn = jax.checkpoint(fn, prevent_cse=True)
    children.append((fn, child_in, child_out))
  return _composed(children, in_vars, out_vars), in_vars, out_vars


def _graph_root(traced: TracedChain, plan: Plan) -> _Segment:
  """The whole graph as its segments in order, each reading and writing crossing values."""
  bounds = (0, *plan.checkpoints, len(traced.layers))
  children = []
  for k, (l, r) in enumerate(zip(bounds[:-1], bounds[1:])):
    in_vars, out_vars = _graph_vars(traced, l, r)
    fn = _function(traced, [e for layer in traced.layers[l:r] for e in layer.eqns], in_vars,
                   out_vars)
    if k < len(bounds) - 2:
      fn = jax.checkpoint(fn, prevent_cse=True)
    children.append((fn, in_vars, out_vars))
  return _graph_composed(traced, children)


def _graph_vars(traced: TracedChain, l: int, r: int) -> tuple[list, list]:
  """``(inputs, outputs)`` of graph layers ``l+1..r``: the values made outside them that
  they read, and the values they make that later layers or the model's result read."""
  inside = traced.layers[l:r]
  made = {v for layer in inside for e in layer.eqns for v in e.outvars}
  in_vars = list(dict.fromkeys(
      v for layer in inside for v in (*layer.inputs, *layer.invariants) if v not in made))
  read_after = {v for layer in traced.layers[r:] for v in layer.inputs}
  out_vars = list(dict.fromkeys(
      v for layer in inside for v in (*layer.outputs, *layer.side_outputs)
      if v in read_after or v in layer.side_outputs))
  return in_vars, out_vars


def _graph_composed(traced: TracedChain, children: list[_Segment]) -> _Segment:
  """A graph's segments in order as one function of the values made outside its layers."""
  made_by_layers = {v for layer in traced.layers for e in layer.eqns for v in e.outvars}
  in_all = list(dict.fromkeys(v for _, in_vars, _ in children for v in in_vars
                              if v not in made_by_layers))
  out_all = list(dict.fromkeys(v for _, _, out_vars in children for v in out_vars))
  return _composed(children, in_all, out_all), in_all, out_all


def _name_of(layer: int, eqn: int) -> str:
  """The ``checkpoint_name`` of the outputs of equation ``eqn`` of layer ``layer`` (0-based)."""
  return f"jaxremat/{layer}/{eqn}"


def named_products(traced: TracedChain, plan: PolicyPlan) -> tuple[str, ...]:
  """One line per group of ``plan`` that keeps products by name (option ``NAMES``): its
  first layer, and each product's equation and output, saved on the device or offloaded
  to host memory (for reports; their ``checkpoint_name`` is ``jaxremat/<layer>/<eqn>``)."""
  lines = []
  for group in plan.groups:
    option = group.option
    eqns = [e for layer in traced.layers[group.start:group.stop] for e in layer.eqns]
    kinds = collections.Counter(
        (eqns[k].primitive.name, eqns[k].outvars[0].aval.str_short(),
         "offloaded" if k in option.offloaded else "saved")
        for k in sorted((*option.saved, *option.offloaded)))
    if kinds:
      lines.append(f"layer {group.start + 1} {traced.layers[group.start].name}: " + ", ".join(
          f"{name} {out}{f' x{count}' if count > 1 else ''} {where}"
          for (name, out, where), count in kinds.items()))
  return tuple(lines)


def _policy_root(traced: TracedChain, plan: PolicyPlan) -> _Segment:
  """The chain (or graph) as its groups in order: ``KEEP`` plainly, the others under
  ``jax.checkpoint`` with the group's policy."""
  n = len(traced.layers)
  children = [policy_segment(traced, g) for g in plan.groups]
  if traced.is_graph:
    return _graph_composed(traced, children)
  in_vars = _segment_inputs(traced.layers)
  out_vars = _segment_outputs(traced, 0, n)
  return _composed(children, in_vars, out_vars), in_vars, out_vars


def policy_segment(traced: TracedChain, group: Group) -> _Segment:
  """``(function, input vars, output vars)`` of the group's layers under its option."""
  layers = traced.layers[group.start:group.stop]
  if traced.is_graph:
    in_vars, out_vars = _graph_vars(traced, group.start, group.stop)
  else:
    in_vars, out_vars = _segment_inputs(layers), _segment_outputs(traced, group.start, group.stop)
  eqns = [e for layer in layers for e in layer.eqns]
  option = group.option
  names = {k: _name_of(group.start, k) for k in (*option.saved, *option.offloaded)}
  fn = _function(traced, eqns, in_vars, out_vars, names)
  if option.kind == KEEP:
    return fn, in_vars, out_vars
  policies = jax.checkpoint_policies
  if option.kind == NAMES:
    saved = [names[k] for k in sorted(option.saved)]
    if option.offloaded:
      policy = policies.save_and_offload_only_these_names(
          names_which_can_be_saved=saved,
          names_which_can_be_offloaded=[names[k] for k in sorted(option.offloaded)],
          offload_src="device", offload_dst="pinned_host")
    else:
      policy = policies.save_only_these_names(*saved)
  else:
    policy = jax_policy(option.kind)
  return jax.checkpoint(fn, prevent_cse=True, policy=policy), in_vars, out_vars


def jax_policy(kind: str | None) -> Callable[..., bool]:
  """JAX's checkpoint policy for a policy option: ``DOTS``, ``DOTS_NO_BATCH`` keep the
  outputs of matrix products; anything else (``RECOMPUTE``, ``None``) keeps nothing."""
  policies = jax.checkpoint_policies
  return {DOTS: policies.dots_saveable,
          DOTS_NO_BATCH: policies.dots_with_no_batch_dims_saveable}.get(
              kind or "", policies.nothing_saveable)
