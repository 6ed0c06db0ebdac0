"""Trace a model to a jaxpr and group its equations into a chain of layers."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from typing import Any

import jax
import numpy as np

from jaxremat._jaxpr import compat as _compat
from jaxremat._jaxpr import granularity as _granularity
from jaxremat._jaxpr import regroup as _regroup
from jaxremat._jaxpr.raised import flax_hint, inputs_hint, integer_hint, model_raised_note
from jaxremat._errors import EmptyModelError, NotAChainError, UnsupportedModelError


@dataclasses.dataclass(frozen=True)
class Layer:
  """One layer of the chain: a run of consecutive equations."""

  name: str
  eqns: tuple[_compat.JaxprEqn, ...]
  inputs: tuple[_compat.Var, ...]  # x_{i-1}: vars made by the previous layer (or the batch)
  invariants: tuple[_compat.Var, ...]  # params, batch, kwargs, constants it reads
  outputs: tuple[_compat.Var, ...]  # x_i: vars later layers read
  side_outputs: tuple[_compat.Var, ...]  # vars it makes that are model outputs


@dataclasses.dataclass(frozen=True)
class TracedChain:
  """A model traced for fixed input shapes, split into a chain of layers.

  The flat inputs are the leaves of ``(params, batch, array_kwargs)``; ``input_vars``
  names them in the jaxpr. ``prelude`` holds equations that depend only on inputs and
  feed more than one layer (they run once, before the chain). ``decomposition`` says
  which modules became the layers and why (for reports).
  """

  input_vars: tuple[_compat.Var, ...]
  const_vars: tuple[_compat.Var, ...]
  consts: tuple[Any, ...]
  num_params: int
  num_batch: int
  prelude: tuple[_compat.JaxprEqn, ...]
  prelude_outputs: tuple[_compat.Var, ...]
  layers: tuple[Layer, ...]
  outvars: tuple[Any, ...]
  out_tree: Any
  not_a_chain: str | None = None
  decomposition: str = ""

  @property
  def is_graph(self) -> bool:
    """True when a layer reads a value made two or more layers earlier (skip tensors)."""
    return self.not_a_chain is not None

  @property
  def param_vars(self) -> tuple[_compat.Var, ...]:
    return self.input_vars[: self.num_params]

  @property
  def batch_vars(self) -> tuple[_compat.Var, ...]:
    return self.input_vars[self.num_params : self.num_params + self.num_batch]


def is_array_leaf(x: Any) -> bool:
  """An array (traced when the model is), or a ``jax.ShapeDtypeStruct`` standing for one."""
  return isinstance(x, (jax.Array, np.ndarray, np.generic, jax.ShapeDtypeStruct))


def split_kwargs(kwargs: dict[str, Any]) -> tuple[list[Any], Any, tuple[Any, ...]]:
  """Splits model kwargs into array leaves (traced) and the rest (static, hashable)."""
  leaves, treedef = jax.tree_util.tree_flatten(kwargs)
  arrays = [x for x in leaves if is_array_leaf(x)]
  static = tuple(None if is_array_leaf(x) else x for x in leaves)
  return arrays, treedef, static


def keyword_names(kwargs: dict[str, Any]) -> list[str]:
  """The keyword of each array leaf of ``kwargs``, in ``split_kwargs``'s order (``""`` for
  those jaxremat passes itself: an nnx module's state)."""
  leaves = jax.tree_util.tree_flatten_with_path(kwargs)[0]
  names = [str(getattr(path[0], "key", path[0])) for path, x in leaves if is_array_leaf(x)]
  return ["" if k.startswith(PRIVATE_KWARGS) else k for k in names]


def merge_kwargs(arrays: Sequence[Any], treedef: Any, static: tuple[Any, ...]) -> dict[str, Any]:
  it = iter(arrays)
  return jax.tree_util.tree_unflatten(treedef, [next(it) if s is None else s for s in static])


#: The prefix of the keyword arguments jaxremat passes itself, left out of what messages
#: show, and of those ``apply_nnx`` passes (the module's graph and state).
PRIVATE_KWARGS = "_jaxremat_"
NNX_KWARGS = PRIVATE_KWARGS + "nnx_"



def trace(
    model_fn: Callable[..., Any],
    params: Any,
    batch: Any,
    kwargs: dict[str, Any],
    layer_depth: int | None = None,
) -> TracedChain:
  """Traces ``model_fn(params, batch, **kwargs)`` and splits it into a chain of layers.

  Layers are runs of equations that share a name-stack prefix (a Flax module path such
  as ``Sequential/layers_3``) ``layer_depth`` components below the root module. By
  default (``None``) the root module's children, each split into its own children
  where it holds a large share of the activation bytes and the layers stay a chain
  (``_granularity.decompose``: ``Encoder/encoderblock_3``). Equations outside any child
  (``nn.relu`` in a ``Sequential``, a reshape) form layers of their own.

  When a layer reads a value made two or more layers earlier (skip connections), the
  layers are linked as a graph: a layer's ``inputs`` are every value it reads from
  earlier layers and its ``outputs`` every value a later layer reads, and
  ``not_a_chain`` says which layer skips which.

  Raises:
    EmptyModelError: the model has no equations that depend on its batch.
  """
  arrays, kw_tree, static = split_kwargs(kwargs)
  params_leaves = jax.tree_util.tree_leaves(params)
  batch_leaves = jax.tree_util.tree_leaves(batch)

  def flat_fn(params, batch, arrays):
    return model_fn(params, batch, **merge_kwargs(arrays, kw_tree, static))

  def spec(x):
    shape = x.shape if isinstance(x, jax.ShapeDtypeStruct) else np.shape(x)
    return jax.ShapeDtypeStruct(shape, jax.numpy.result_type(x) if not hasattr(x, "dtype") else x.dtype)

  specs = jax.tree_util.tree_map(spec, (params, batch, arrays))
  try:
    closed, out_shape = jax.make_jaxpr(flat_fn, return_shape=True)(*specs)
  except Exception as err:
    err.add_note(model_raised_note(params, specs[1], nnx=any(
        k.startswith(NNX_KWARGS) for k in kwargs), hint=flax_hint(err) or integer_hint(
            err, specs[1]) or inputs_hint(err, model_fn)))
    raise
  out_tree = jax.tree_util.tree_structure(out_shape)
  jaxpr, consts = _unwrap_calls(closed.jaxpr, list(closed.consts))
  input_vars = tuple(jaxpr.invars)
  const_vars = tuple(jaxpr.constvars)
  invariant = set(input_vars) | set(const_vars)
  eqns = _live(jaxpr.eqns, jaxpr.outvars)
  _reject_unsupported(eqns)

  batch_vars = input_vars[len(params_leaves) : len(params_leaves) + len(batch_leaves)]
  if layer_depth is None:
    chosen = _granularity.decompose(eqns, invariant, batch_vars, input_vars[:len(params_leaves)],
                                    jaxpr.outvars)
    prelude, groups, decomposition = list(chosen.prelude), list(chosen.groups), chosen.description
  else:
    groups = _granularity.group(eqns, layer_depth)
    prelude, groups = _regroup.hoist_invariant_values(groups, invariant - set(batch_vars))
    groups = _regroup.attach_output_work(
        [(name, g) for name, g in groups if g],
        invariant | {v for e in prelude for v in e.outvars}, jaxpr.outvars)
    decomposition = f"layer_depth={layer_depth} ({len(groups)} layers)"
  prelude_outputs = tuple(dict.fromkeys(v for e in prelude for v in e.outvars))
  invariant |= set(prelude_outputs)
  decomposition += _granularity.keyword_values_note(
      prelude, {v for _, g in groups for e in g for v in e.invars
                if not isinstance(v, _compat.Literal)},
      {v: k for v, k in zip(input_vars[len(params_leaves) + len(batch_leaves):],
                            keyword_names(kwargs)) if k})
  if not groups:
    raise EmptyModelError(
        "the model has no layers: its outputs do not depend on the batch through any "
        "computation, so there is nothing to checkpoint.")
  try:
    layers, not_a_chain = _link(groups, invariant, jaxpr.outvars), None
  except NotAChainError as err:
    layers, not_a_chain = _link_graph(groups, invariant, jaxpr.outvars), str(err)
  return TracedChain(
      input_vars=input_vars,
      const_vars=const_vars,
      consts=tuple(consts),
      num_params=len(params_leaves),
      num_batch=len(batch_leaves),
      prelude=tuple(prelude),
      prelude_outputs=prelude_outputs,
      layers=layers,
      outvars=tuple(jaxpr.outvars),
      out_tree=out_tree,
      not_a_chain=not_a_chain,
      decomposition=decomposition,
  )


def _unwrap_calls(jaxpr, consts):
  """Looks inside a model that is one jit call (``jax.jit(model.apply)``)."""
  while len(jaxpr.eqns) == 1 and not jaxpr.constvars:
    eqn = jaxpr.eqns[0]
    inner = _compat.inner_closed_jaxpr(eqn)
    if inner is None or list(eqn.invars) != list(jaxpr.invars) or list(eqn.outvars) != list(jaxpr.outvars):
      break
    jaxpr, consts = inner.jaxpr, list(inner.consts)
  return jaxpr, consts


def _live(eqns, outvars) -> list:
  """The equations the outputs need, or with effects (Flax's nn.scan leaves dead ones)."""
  live = {v for v in outvars if not isinstance(v, _compat.Literal)}
  kept = []
  for eqn in reversed(eqns):
    if eqn.effects or any(v in live for v in eqn.outvars):
      kept.append(eqn)
      live.update(v for v in eqn.invars if not isinstance(v, _compat.Literal))
  return kept[::-1]


_UNSUPPORTED = ("callback", "io_callback", "debug_callback")


def _reject_unsupported(eqns):
  for eqn in eqns:
    _reject_transform(eqn)
    if any(name in eqn.primitive.name for name in _UNSUPPORTED) or eqn.effects:
      where = "/".join(_compat.name_stack(eqn)) or "the model's top level"
      raise UnsupportedModelError(
          f"equation {eqn.primitive.name!r} in {where} has side effects "
          f"({sorted(map(str, eqn.effects)) or 'a host callback'}); a rematerialised "
          "segment runs twice, so jaxremat does not re-execute effects. Remove the "
          "callback (jax.debug.print, io_callback) from the model or move it outside.")


def _reject_transform(eqn):
  """A model_fn that differentiates inside itself is not a forward chain of layers."""
  if any(part.startswith("transpose(") for part in _compat.name_stack(eqn)):
    raise UnsupportedModelError(
        "model_fn computes a gradient itself (jax.grad or jax.vjp inside it); jaxremat "
        "needs the forward model. Pass model.apply and take jax.grad of a loss of r.fn.")


def _link(groups, invariant, outvars) -> tuple[Layer, ...]:
  """Finds each layer's inputs and outputs and checks that the layers form a chain."""
  skip = _regroup.first_skip(groups, invariant)
  if skip is not None:
    li, src = skip
    raise NotAChainError(
        f"layer {li + 1} {groups[li][0]!r} reads a value made by layer {src + 1} "
        f"{groups[src][0]!r}, skipping over layer {src + 2} {groups[src + 1][0]!r}: "
        "the model is not a chain at this granularity. Group the skip connection "
        "into one module (e.g. a residual block whose __call__ adds its input) or "
        "pass layer_depth= to choose another granularity.")
  model_outputs = {v for v in outvars if not isinstance(v, _compat.Literal)}
  reads: list[list] = []
  inv_reads: list[list] = []
  for group in (g for _, g in groups):
    own = {v for e in group for v in e.outvars}
    ext, inv = [], []
    for eqn in group:
      for v in eqn.invars:
        if isinstance(v, _compat.Literal) or v in own:
          continue
        if v in invariant:
          inv.append(v)
          continue
        ext.append(v)
    reads.append(list(dict.fromkeys(ext)))
    inv_reads.append(list(dict.fromkeys(inv)))
  layers = []
  n = len(groups)
  for li, (name, group) in enumerate(groups):
    made = [v for e in group for v in e.outvars]
    later = set(reads[li + 1]) if li + 1 < n else set()
    outputs = tuple(v for v in made if v in later)
    side = tuple(v for v in made if v in model_outputs)
    inputs = tuple(reads[li])
    if li == 0:
      inputs = ()  # the first layer's x_0 is part of the batch (an invariant input)
    layers.append(Layer(name, tuple(group), inputs, tuple(inv_reads[li]), outputs, side))
  return tuple(layers)


def _link_graph(groups, invariant, outvars) -> tuple[Layer, ...]:
  """Each layer's inputs (values made by any earlier layer) and outputs (values any later
  layer reads), for models that are not chains."""
  model_outputs = {v for v in outvars if not isinstance(v, _compat.Literal)}
  reads: list[tuple] = []
  inv_reads: list[tuple] = []
  read_later: set = set()
  for _, group in groups:
    own = {v for e in group for v in e.outvars}
    ext = [v for e in group for v in e.invars if not isinstance(v, _compat.Literal) and v not in own]
    reads.append(tuple(dict.fromkeys(v for v in ext if v not in invariant)))
    inv_reads.append(tuple(dict.fromkeys(v for v in ext if v in invariant)))
  layers = []
  for li in range(len(groups) - 1, -1, -1):
    name, group = groups[li]
    made = [v for e in group for v in e.outvars]
    outputs = tuple(v for v in made if v in read_later)
    side = tuple(v for v in made if v in model_outputs)
    layers.append(Layer(name, tuple(group), reads[li], inv_reads[li], outputs, side))
    read_later.update(reads[li])
  return tuple(reversed(layers))
