"""The few jaxpr internals jaxremat relies on, behind one module (tested in test_compat)."""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from typing import Any, cast

import jax
from jax.ad_checkpoint import checkpoint_name
from jax.extend import core as jex_core

Var = jex_core.Var
Literal = jex_core.Literal
JaxprEqn = jex_core.JaxprEqn

# Primitives that wrap a whole sub-program; a model traced under an outer jit shows up
# as a single such equation, which jaxremat looks inside.
CALL_PRIMITIVES = frozenset({"pjit", "jit", "closed_call", "core_call"})

#: Equations that only wrap a sub-program (calls and ``custom_jvp``): judged by the
#: equations inside.
WRAPPER_PRIMITIVES = CALL_PRIMITIVES | {"custom_jvp_call"}

#: Elementwise maps, broadcasts and reshapes XLA fuses into their consumer.
FUSIBLE_PRIMITIVES = frozenset({
    "abs", "add", "and", "broadcast_in_dim", "convert_element_type", "div", "eq", "exp",
    "expand_dims", "ge", "gt", "integer_pow", "le", "log", "logistic", "lt", "max", "min", "mul",
    "ne", "neg", "not", "one_minus_square", "or", "reshape", "rsqrt", "select_n", "sign", "sqrt",
    "square", "squeeze", "sub", "tanh",
})


#: Fusible primitives too costly for XLA to recompute in a second fusion.
EXPENSIVE_PRIMITIVES = frozenset({"div", "exp", "log", "logistic", "rsqrt", "sqrt", "tanh"})

#: Fusible primitives XLA recomputes in each fusion that needs them.
CHEAP_PRIMITIVES = FUSIBLE_PRIMITIVES - EXPENSIVE_PRIMITIVES

#: Elementwise primitives among the fusible ones (no broadcast or reshape).
ELEMENTWISE_PRIMITIVES = FUSIBLE_PRIMITIVES - {"broadcast_in_dim", "expand_dims", "reshape", "squeeze"}

#: The max-pool gradient: a scatter of the cotangent into zeros at argmax indices, which
#: XLA writes as ``s32`` (``INDEX_BYTES`` each).
POOL_GRADIENT_PRIMITIVES = frozenset({"select_and_scatter_add"})
INDEX_BYTES = 4


def name_stack(eqn: JaxprEqn) -> tuple[str, ...]:
  """The equation's name stack (Flax module path, named scopes) as components."""
  text = str(eqn.source_info.name_stack)
  return tuple(part for part in text.split("/") if part)


#: ``jax.checkpoint``'s primitive names (``nn.remat``, ``nnx.remat``), across jax versions.
REMAT_PRIMITIVES = frozenset({"checkpoint", "remat2"})


def module_path(eqn: JaxprEqn) -> tuple[str, ...]:
  """The module path an equation runs in: its name stack, and for a ``jax.checkpoint``
  call (``nn.remat(Block)``, whose own stack stops at the caller) the path its equations
  share below it (``block_0``)."""
  stack = name_stack(eqn)
  if eqn.primitive.name in REMAT_PRIMITIVES:
    inner = eqn.params["jaxpr"]
    paths = [p for e in getattr(inner, "jaxpr", inner).eqns if (p := module_path(e))]
    stack += tuple(os.path.commonprefix(paths)) if paths else ()
  return stack


def array_aval(v: Var | Literal) -> jax.core.ShapedArray:
  """The abstract array of a var (or literal) known to hold an array (JAX types ``Var.aval`` as the
  base ``AbstractValue``, which has no shape or dtype)."""
  return cast(jax.core.ShapedArray, v.aval)


def inner_closed_jaxpr(eqn: JaxprEqn) -> jex_core.ClosedJaxpr | None:
  """The ClosedJaxpr a call-like equation (jit) runs, or None for other equations."""
  if eqn.primitive.name not in CALL_PRIMITIVES:
    return None
  inner = eqn.params.get("jaxpr", eqn.params.get("call_jaxpr"))
  if isinstance(inner, jex_core.ClosedJaxpr):
    return inner
  if isinstance(inner, jex_core.Jaxpr):
    return jex_core.ClosedJaxpr(inner, ())
  return None


#: Primitives that draw random bits from a key.
RANDOM_PRIMITIVES = frozenset({"random_bits", "rng_bit_generator", "threefry2x32", "rng_uniform"})


def draws_random_bits(eqns: Iterable[JaxprEqn]) -> bool:
  """True when ``eqns`` (or a jaxpr nested in one of their parameters) draw random bits."""
  return any(eqn.primitive.name in RANDOM_PRIMITIVES for eqn in all_eqns(eqns))


def weighted_eqns(eqns: Iterable[JaxprEqn], times: int = 1) -> Iterator[tuple[JaxprEqn, int]]:
  """``all_eqns``, each with how many times a run executes it (a scan body's, ``length``
  times per run of the scan)."""
  for eqn in eqns:
    yield eqn, times
    inner_times = times * eqn.params["length"] if eqn.primitive.name == "scan" else times
    for jaxpr in param_jaxprs(eqn.params):
      yield from weighted_eqns(jaxpr.eqns, inner_times)


def fusible(eqn: JaxprEqn, primitives: frozenset = FUSIBLE_PRIMITIVES) -> bool:
  """True when XLA fuses ``eqn`` into its consumer: one of ``primitives``, or a call
  (``jit``, ``custom_jvp``) of only such primitives."""
  return fusible_op(eqn.primitive.name, eqn.params, primitives)


def fusible_op(name: str, params: dict, primitives: frozenset = FUSIBLE_PRIMITIVES) -> bool:
  """``fusible`` for an equation given as its primitive's name and params (as
  ``inlined_eqns`` gives them)."""
  if name not in WRAPPER_PRIMITIVES:
    return name in primitives
  inner = [e for e in _params_eqns(params) if e.primitive.name not in WRAPPER_PRIMITIVES]
  return all(e.primitive.name in primitives for e in inner)


def all_eqns(eqns: Iterable[JaxprEqn]) -> Iterator[JaxprEqn]:
  """Every equation of ``eqns`` and, recursively, of the sub-jaxprs in their params
  (jit bodies, custom_jvp functions, scan and cond bodies), each container first."""
  for eqn in eqns:
    yield eqn
    yield from _params_eqns(eqn.params)


def _params_eqns(params: dict) -> Iterator[JaxprEqn]:
  """``all_eqns`` of the sub-jaxprs in an equation's ``params``."""
  for jaxpr in param_jaxprs(params):
    yield from all_eqns(jaxpr.eqns)


def param_jaxprs(params: dict) -> Iterator[Any]:
  """The jaxprs in an equation's ``params`` (jit bodies, custom_jvp functions, scan and
  cond bodies; a closed one's jaxpr)."""
  for value in params.values():
    for sub in value if isinstance(value, (tuple, list)) else (value,):
      inner: Any = getattr(sub, "jaxpr", sub)
      if hasattr(inner, "eqns"):
        yield inner


def input_dependent(jaxpr: jex_core.Jaxpr, varying_inputs: Iterable[Var] | None = None) -> set:
  """Vars of ``jaxpr`` whose values depend on its inputs (not only on literals and
  constants); ``varying_inputs`` (default: all of ``jaxpr.invars``) are those that vary.
  Calls (``jit``) are followed inside, so an output a call merely computes from its
  constant arguments (a causal mask through ``jnp.where``) does not vary."""
  varying = set(jaxpr.invars if varying_inputs is None else varying_inputs)
  for eqn in jaxpr.eqns:
    flags = [not isinstance(v, Literal) and v in varying for v in eqn.invars]
    if not any(flags):
      continue
    inner = inner_closed_jaxpr(eqn)
    if inner is None:
      varying.update(eqn.outvars)
      continue
    inner_varying = input_dependent(inner.jaxpr, [v for v, f in zip(inner.jaxpr.invars, flags) if f])
    varying.update(v for v, inner_out in zip(eqn.outvars, inner.jaxpr.outvars)
                   if not isinstance(inner_out, Literal) and inner_out in inner_varying)
  return varying


def inlined_eqns(jaxpr: jex_core.Jaxpr) -> tuple[list[tuple[str, list, list, dict]], dict]:
  """The equations of ``jaxpr`` with calls (``jit``) inlined, as ``(primitive name,
  invars, outvars, params)``, and the renaming: a call's outputs are renamed to the inner
  values they return (``renaming.get(v, v)``), so data flow can be followed across calls."""
  rename: dict = {}
  out: list[tuple[str, list, list, dict]] = []

  def visit(inner: jex_core.Jaxpr) -> None:
    for eqn in inner.eqns:
      ins = [v if isinstance(v, Literal) else rename.get(v, v) for v in eqn.invars]
      called = inner_closed_jaxpr(eqn)
      if called is None:
        out.append((eqn.primitive.name, ins, list(eqn.outvars), eqn.params))
        continue
      rename.update((v, a) for v, a in zip(called.jaxpr.invars, ins))
      visit(called.jaxpr)
      for v, r in zip(eqn.outvars, called.jaxpr.outvars):
        if not isinstance(r, Literal):
          rename[v] = rename.get(r, r)

  visit(jaxpr)
  return out, rename


def dataflow(eqns: Sequence[tuple[str, list, list, dict]]) -> tuple[dict, dict]:
  """For ``inlined_eqns`` equations: the index of the equation producing each value, and
  the indices of those reading it."""
  producer: dict[Any, int] = {}
  consumers: dict[Any, list[int]] = {}
  for k, (_, ins, outs, _) in enumerate(eqns):
    producer.update((v, k) for v in outs)
    for v in non_literals(ins):
      consumers.setdefault(v, []).append(k)
  return producer, consumers


def spliced(jaxpr: jex_core.Jaxpr, invars: Sequence[Any], outvars: Sequence[Any],
            **changes: Any) -> list[JaxprEqn]:
  """The equations of ``jaxpr`` with its inputs and outputs renamed to ``invars`` and
  ``outvars``: its work in place of an equation calling it (``changes``, e.g.
  ``source_info``, set on each)."""
  rename: dict[Any, Any] = {**dict(zip(jaxpr.invars, invars)),
                            **dict(zip(jaxpr.outvars, outvars))}
  return [e.replace(invars=[v if isinstance(v, Literal) else rename.get(v, v) for v in e.invars],
                    outvars=[rename.get(v, v) for v in e.outvars], **changes)
          for e in jaxpr.eqns]


def non_literals(atoms: Iterable) -> list:
  """The vars among ``atoms`` (literals left out)."""
  return [v for v in atoms if not isinstance(v, Literal)]


def effects_of(eqns: Sequence[JaxprEqn]) -> frozenset:
  out: set = set()
  for eqn in eqns:
    out |= set(eqn.effects)
  return frozenset(out)


def sub_function(
    eqns: Sequence[JaxprEqn], invars: Sequence[Var], outvars: Sequence[Any]
) -> Callable[..., list]:
  """A function evaluating ``eqns`` from ``invars`` to ``outvars`` (a list of arrays)."""
  info = jex_core.DebugInfo(
      "jaxremat", "segment", tuple(f"x{k}" for k in range(len(invars))),
      tuple(f"[{k}]" for k in range(len(outvars))))
  jaxpr = jex_core.Jaxpr((), list(invars), list(outvars), list(eqns), effects_of(eqns), info)
  return jex_core.jaxpr_as_fun(jex_core.ClosedJaxpr(jaxpr, ()))


def inlined_function(
    eqns: Sequence[JaxprEqn], invars: Sequence[Var], outvars: Sequence[Any]
) -> Callable[..., list]:
  """Like ``sub_function``, with calls (``jit``) evaluated equation by equation, so that
  a trace of it (or of its VJP) holds their equations inline, not a call."""

  def run(eqns, invars, outvars, args):
    env = dict(zip(invars, args))
    read = lambda v: v.val if isinstance(v, Literal) else env[v]
    for eqn in eqns:
      values = [read(v) for v in eqn.invars]
      inner = inner_closed_jaxpr(eqn)
      if inner is not None:
        env.update(zip(inner.jaxpr.constvars, inner.consts))
        outs = run(inner.jaxpr.eqns, inner.jaxpr.invars, inner.jaxpr.outvars, values)
      else:
        outs = _bind(eqn, values)
      env.update(zip(eqn.outvars, outs))
    return [read(v) for v in outvars]

  return lambda *args: run(eqns, invars, outvars, args)


def named_function(
    eqns: Sequence[JaxprEqn], invars: Sequence[Var], outvars: Sequence[Any],
    names: Mapping[int, str]
) -> Callable[..., list]:
  """Like ``sub_function``, with the outputs of equation ``k`` (a position in ``eqns``)
  passed through ``checkpoint_name(..., names[k])``, so that a checkpoint policy can
  save or offload them by name."""

  def run(*args):
    env = dict(zip(invars, args))
    read = lambda v: v.val if isinstance(v, Literal) else env[v]
    for k, eqn in enumerate(eqns):
      outs = _bind(eqn, [read(v) for v in eqn.invars])
      if k in names:
        outs = [checkpoint_name(o, names[k]) for o in outs]
      env.update(zip(eqn.outvars, outs))
    return [read(v) for v in outvars]

  return run


def _bind(eqn: JaxprEqn, values: Sequence[Any]) -> list:
  """The outputs of ``eqn`` applied to ``values``."""
  params = eqn.primitive.get_bind_params(eqn.params)
  subfuns, params = params if isinstance(params, tuple) else ((), params)  # older jax: a pair
  outs = eqn.primitive.bind(*subfuns, *values, **params)
  return list(outs) if eqn.primitive.multiple_results else [outs]


def aval_bytes(aval: Any) -> int:
  """Bytes of one abstract array (dtype-aware; extended dtypes such as PRNG keys too)."""
  shape = getattr(aval, "shape", ())
  dtype = getattr(aval, "dtype", None)
  if dtype is None:
    return 0
  size = 1
  for d in shape:
    size *= int(d)
  return size * int(jax.numpy.dtype(dtype).itemsize) if not jax.dtypes.issubdtype(
      dtype, jax.dtypes.extended) else size * _key_itemsize(dtype)


def _key_itemsize(dtype: Any) -> int:
  impl = getattr(dtype, "_impl", None)
  key_shape = getattr(impl, "key_shape", (2,))
  size = 4
  for d in key_shape:
    size *= int(d)
  return size


def is_float(aval: Any) -> bool:
  """True when values of this aval get real-valued cotangents."""
  dtype = getattr(aval, "dtype", None)
  return dtype is not None and jax.dtypes.issubdtype(dtype, jax.numpy.inexact)


def is_staged(x: Any) -> bool:
  """Whether ``x`` is traced for a compile (``jax.jit``, ``make_jaxpr``), under any
  transformations: False for an eager ``jax.grad`` or ``vmap`` of concrete values. A
  tracer of an unknown kind counts as staged."""
  while isinstance(x, jax.core.Tracer):
    if type(x).__name__ == "DynamicJaxprTracer":
      return True
    inner = getattr(x, "primal", getattr(x, "val", x))  # JVP/linearize, batch tracers
    if inner is x:
      return True
    x = inner
  return False
