"""Argument checks at the API boundary, and the bytes every plan holds (parameters, batch)."""

from __future__ import annotations

import collections.abc
import functools
import inspect
import warnings
from collections.abc import Callable
from typing import Any, ParamSpec, TypeVar

import flax.linen as nn
import jax
from flax import nnx

from jaxremat._api.loss import training_output
from jaxremat._backends.measure import check_scalar_loss
from jaxremat._backends.targets import Target
from jaxremat._errors import (EmptyModelError, InvalidArgumentError, InvalidBudgetError,
                              UnsupportedModelError)
from jaxremat._jaxpr import compat as _compat
from jaxremat._jaxpr.raised import option_note, tree_shapes
from jaxremat._jaxpr.trace import TracedChain, is_array_leaf, trace
from jaxremat._model.chain import Plan
from jaxremat.solvers._budget import budget_as_int


class BatchAxisWarning(UserWarning):
  """No output of the model has the batch's first axis: flax layers read an input
  without its batch axis as one example, and the plan is for that."""


def traced_model(model_fn: Callable[..., Any], params: Any, batch: Any,
                 model_kwargs: dict[str, Any], layer_depth: int | None,
                 loss_fn: Any, entry: Callable[..., Any]) -> TracedChain:
  """The model traced into layers, after the checks its parameters and trace allow:
  float parameters, float outputs, a loss that takes them, and the batch's first axis in
  an output (``BatchAxisWarning``). ``entry``: the caller (``apply``, ``fit``), whose
  options a keyword the model refuses may be a misspelling of."""
  check_float_params(params)
  try:
    traced = trace(model_fn, params, batch, model_kwargs, layer_depth)
  except TypeError as err:
    options = [p.name for p in inspect.signature(entry).parameters.values()
               if p.kind is p.KEYWORD_ONLY]
    note = option_note(str(err), model_kwargs, f"jaxremat.{entry.__name__}", options)
    if note:
      err.add_note(note)
    raise
  check_float_output(traced)
  check_loss_output(traced, model_kwargs, loss_fn)
  _warn_if_unbatched(traced, batch)
  return traced


def check_loss_fn(loss_fn: Any) -> None:
  """Rejects a ``loss_fn`` that is not a function of one argument (the model's output)."""
  if loss_fn is None:
    return
  example = ("e.g. lambda logits: optax.softmax_cross_entropy_with_integer_labels(logits, "
             "labels).mean()")
  if not callable(loss_fn):
    raise InvalidArgumentError(
        f"loss_fn must be a function of the model's output returning a float scalar "
        f"({example}), got {type(loss_fn).__name__}.")
  try:
    signature = inspect.signature(loss_fn)
  except (TypeError, ValueError):  # a builtin without one: its call will tell
    return
  try:
    signature.bind(None)
  except TypeError:
    raise InvalidArgumentError(
        f"loss_fn is called with the model's output alone, but {signature} does not take "
        f"one argument; close over the labels ({example}).") from None


def check_loss_output(traced: TracedChain, model_kwargs: dict[str, Any], loss_fn: Any) -> None:
  """Rejects a ``loss_fn`` whose value on the traced model's output is not a float
  scalar, by the output's shapes alone (the model is not traced again, nothing compiled),
  before any step is compiled with it."""
  if loss_fn is None:
    return
  outputs = training_output(jax.tree_util.tree_unflatten(
      traced.out_tree, [jax.ShapeDtypeStruct(v.aval.shape, v.aval.dtype) for v in traced.outvars]),
      model_kwargs)
  try:
    value = jax.eval_shape(loss_fn, outputs)
  except Exception as err:  # the user's function on the model's output, not jaxremat's
    how = ("with mutable= the output without its updated collections (the logits alone, "
           "not (logits, state): loss_fn=lambda logits: xent(logits))"
           if model_kwargs.get("mutable") else "the output as the model returns it: for a "
           "tuple or a dict, pick the part the loss reads (loss_fn=lambda out: "
           "xent(out[0]) or xent(out['logits']))")
    raise InvalidArgumentError(
        f"loss_fn raised {type(err).__name__} ({err}) when called on the model's output, "
        f"{tree_shapes(outputs)}. loss_fn takes {how}.") from err
  check_scalar_loss(value, "out")


class _Required:
  """The default of a positional argument that must be given: a call without it gets
  the model check first (an nnx module passed as ``model_fn`` leaves one argument
  short), then a ``check_given`` error, not Python's bare ``TypeError``."""

  def __repr__(self) -> str:
    return "<required>"


REQUIRED: Any = _Required()

_P = ParamSpec("_P")
_R = TypeVar("_R")


def positional(*names: str) -> Callable[[Callable[_P, _R]], Callable[_P, _R]]:
  """Rejects a call of the decorated entry point with more positional arguments than
  ``names`` (its own): the one after them is most likely the model's own (``train`` or a
  second input), which goes by keyword. Python's own ``TypeError`` would not say so."""

  def decorate(entry: Callable[_P, _R]) -> Callable[_P, _R]:
    @functools.wraps(entry)
    def checked(*args: _P.args, **kwargs: _P.kwargs) -> _R:
      if len(args) > len(names):
        extra = ", ".join(_described(a) for a in args[len(names):])
        call = ", ".join({"model_fn": "model.apply", "batch": "x"}.get(n, n) for n in names)
        raise InvalidArgumentError(
            f"{entry.__name__}() takes {len(names)} positional arguments ({', '.join(names)})"
            f", got {len(args)}: {extra} after them. The model's other arguments go by "
            f"keyword, named as its call names them: {entry.__name__}({call}, train=True), "
            "or a second input as tokens=tokens; r.fn is then called with the same keywords.")
      return entry(*args, **kwargs)
    return checked
  return decorate


def _described(value: Any) -> str:
  """An argument in an error: an array by dtype and shape, anything else by its repr."""
  if hasattr(value, "shape") and hasattr(value, "dtype"):
    return f"a {value.dtype}{list(value.shape)} array"
  return f"{value!r:.40}"


def check_given(entry: str, **arguments: Any) -> None:
  """Rejects a call of ``entry`` (e.g. ``"apply(model_fn, params, batch)"``) that left
  one of ``arguments`` at ``REQUIRED``."""
  missing = [name for name, value in arguments.items() if value is REQUIRED]
  if missing:
    raise InvalidArgumentError(
        f"{entry} was called without {', '.join(missing)}: pass every one of its "
        "positional arguments.")


def check_not_swapped(params: Any, batch: Any, call: str) -> None:
  """Rejects a call whose batch is a Flax variables dict (a mapping with ``'params'``)
  while params is not: the two were passed the other way round (``apply(model.apply, x,
  variables)``), which the model would meet as an int batch or a failed lookup deep in
  JAX. ``call``: the right call, e.g. ``"jaxremat.apply(model.apply, variables, x)"``."""
  def variables(tree: Any) -> bool:
    return isinstance(tree, collections.abc.Mapping) and "params" in tree
  if variables(batch) and not variables(params):
    got = _described(params) if is_array_leaf(params) else f"a {type(params).__name__}"
    raise InvalidArgumentError(
        f"batch is a dict with a 'params' entry (a Flax variables dict) and params is {got}: "
        f"params and batch look swapped. The variables come first, then the batch: {call}.")


def check_budget_keyword(model_kwargs: dict[str, Any], entry: str) -> None:
  """Rejects a budget keyword of the other entry point (``apply``'s ``budget_bytes``,
  ``fit``'s ``memory_budget``), which would go on to the model as one of its own."""
  other = {"apply": ("memory_budget", "jaxremat.fit's budget (the fastest step within a "
                     "share of the activations, memory_budget=0.5, or bytes); apply's is "
                     "budget_bytes= (bytes)"),
           "fit": ("budget_bytes", "jaxremat.apply's budget; fit's is memory_budget, its "
                   "fourth argument (a share of the activations, 0.5, or bytes)")}
  name, what = other[entry]
  if name in model_kwargs:
    raise InvalidArgumentError(
        f"{entry}() got {name}={model_kwargs[name]!r}, which would be passed to the model as "
        f"one of its keyword arguments: {name} is {what}.")


def check_model_fn(model_fn: Callable[..., Any], nnx_entry: str = "apply_nnx(model, batch)",
                   entry: str = "apply(model.apply, params, batch)") -> None:
  """``model_fn`` is a function (``model.apply``), not a module; the messages name the
  call to make: ``jaxremat.{entry}``, for an nnx module ``jaxremat.{nnx_entry}``."""
  if isinstance(model_fn, nnx.Module):
    raise InvalidArgumentError(
        f"model_fn is an nnx module ({type(model_fn).__name__}): plan it with "
        f"jaxremat.{nnx_entry}, which splits its state into params.")
  if isinstance(model_fn, nn.Module):
    raise InvalidArgumentError(
        f"model_fn is a Flax module ({type(model_fn).__name__}), not its apply function: "
        f"call jaxremat.{entry}.")
  if isinstance(owner := getattr(model_fn, "__self__", None), nnx.Module):
    raise InvalidArgumentError(
        f"model_fn is a method of an nnx module ({type(owner).__name__}."
        f"{getattr(model_fn, '__name__', '')}): plan the module with "
        f"jaxremat.{nnx_entry}, which splits its state into params.")
  if not callable(model_fn):
    raise InvalidArgumentError(
        f"model_fn must be callable (e.g. model.apply), got {type(model_fn).__name__}.")


def check_arrays(what: str, tree: Any) -> None:
  """Every leaf of ``tree`` is an array or a ``jax.ShapeDtypeStruct`` (planning allocates
  nothing), and none is a tracer; else one error naming the first five that are not."""
  leaves = jax.tree_util.tree_leaves_with_path(tree)
  traced = [jax.tree_util.keystr(p) for p, x in leaves if isinstance(x, jax.core.Tracer)]
  if traced:
    raise InvalidArgumentError(
        f"{what}{traced[0]} is a tracer: jaxremat.apply traces the model itself and cannot "
        "run inside jax.jit, grad or vmap. Call it once outside, with arrays or with "
        "jax.ShapeDtypeStructs (e.g. jax.eval_shape(model.init, key, x)), and use r.fn "
        "inside the jitted step. Called outside already? Then the tree holds a tracer "
        "leaked from a transformation, e.g. a jax.checkpoint or jax.jit around a Flax "
        "submodule's call during model.init (model.apply itself then raises "
        "UnexpectedTracerError): use nn.remat / nn.jit inside Flax modules.")
  bad = [(jax.tree_util.keystr(p), type(x).__name__) for p, x in leaves
         if not is_array_leaf(x)]
  if bad:
    shown = ", ".join(f"{what}{path} is a {kind}" for path, kind in bad[:5])
    raise InvalidArgumentError(
        f"every leaf of {what} must be an array (jax.Array or numpy.ndarray) or a "
        f"jax.ShapeDtypeStruct: {shown}. Convert with jnp.asarray or pass non-array options "
        "as keyword arguments.")
  explicit = [jax.tree_util.keystr(p) for p, x in leaves if _explicit_mesh(x)]
  if explicit:
    raise InvalidArgumentError(
        f"{what}{explicit[0]} is sharded over an Explicit axis of its mesh (jax.make_mesh's "
        "default axis type): jaxremat plans arrays sharded over Auto axes, whose shardings XLA "
        "propagates. Make the mesh with jax.make_mesh(shape, names, axis_types=("
        "jax.sharding.AxisType.Auto,) * len(names)).")


def _explicit_mesh(x: Any) -> bool:
  """True when ``x`` is sharded by name over an Explicit axis of its mesh (replicated
  over one is fine)."""
  sharding = getattr(x, "sharding", None)
  mesh, spec = getattr(sharding, "mesh", None), getattr(sharding, "spec", None)
  if mesh is None or spec is None:
    return False
  types = dict(zip(mesh.axis_names, getattr(mesh, "axis_types", ())))
  named = [a for entry in spec if entry is not None
           for a in (entry if isinstance(entry, tuple) else (entry,))]
  return any(types.get(a) == jax.sharding.AxisType.Explicit for a in named)


#: What predicts a plan's footprint: the jaxpr estimate, or the compiled plain step replayed.
PROFILES = ("jaxpr", "compiled")


#: ``layer_depth`` of ``apply`` that compares the layers found with those one and two
#: levels below them.
SEARCH = "search"


def check_options(plan: Any, layer_depth: Any, allow_search: bool = False) -> None:
  """``plan`` a ``Plan`` or None; ``layer_depth`` None, an int >= 0 or (``allow_search``,
  ``apply``'s) ``SEARCH``."""
  if plan is not None and not isinstance(plan, Plan):
    raise InvalidArgumentError(
        f"plan must be a jaxremat.Plan, got {type(plan).__name__} {plan!r}; wrap the "
        "checkpoint indices, e.g. plan=jaxremat.Plan(checkpoints=(2, 5)).")
  if allow_search and layer_depth == SEARCH:
    return
  if layer_depth is not None and (isinstance(layer_depth, bool) or not isinstance(layer_depth, int)
                                  or layer_depth < 0):
    also = (f" or {SEARCH!r} (compare deeper layers by compiling)" if allow_search
            else f" ({SEARCH!r} is jaxremat.apply's)")
    raise InvalidArgumentError(
        f"layer_depth must be None, an int >= 0 (0: the root module, 1: its children, "
        f"...){also}, got {layer_depth!r}.")


def check_search(plan: Any, method: str, budget: int | None, verify: bool | None) -> None:
  """``layer_depth="search"`` compiles the optimal plan of each depth to compare them:
  no ``plan``, ``budget``, other ``method`` or ``verify=False``."""
  refused = [("plan=", plan is not None), ("budget_bytes=", budget is not None),
             (f"method={method!r}", method != "optimal"), ("verify=False", verify is False)]
  given = [name for name, present in refused if present]
  if given:
    raise InvalidArgumentError(
        f"layer_depth={SEARCH!r} compiles the optimal plan at the layers found and one "
        f"and two levels below them, and keeps what XLA measures least; it does not "
        f"take {given[0]}. Drop it, or pass an int layer_depth.")


def default_profile(target: Any, backend: str, traced: TracedChain | None = None) -> str:
  """The profile used when none is given: the compiled one for a GPU, named as ``target``
  or local (``backend``, ``jax.default_backend()``), where the jaxpr rules were never
  fitted; for ``traced`` a graph of layers, on any backend, where the jaxpr profile has
  only model G, or a model drawing random bits (dropout), whose bits XLA:CPU keeps as
  its key's kind makes them (8 bytes an element for threefry) where the estimate keeps
  JAX's mask; else the jaxpr estimate."""
  return ("compiled" if target is not None or backend == "gpu" or traced is not None and (
      traced.is_graph or any(_compat.draws_random_bits(layer.eqns) for layer in traced.layers))
      else "jaxpr")


def check_profile(profile: Any) -> None:
  if profile not in PROFILES:
    raise InvalidArgumentError(
        f"profile must be one of {PROFILES} (the jaxpr estimate, or the replay of the "
        f"plain step XLA compiled), got {profile!r}.")


def check_budget(budget_bytes: Any) -> int | None:
  """``budget_bytes`` as whole bytes (floats rounded down; +inf: no budget)."""
  try:
    budget = budget_as_int(budget_bytes)
  except TypeError:
    raise InvalidArgumentError(
        f"budget_bytes must be a number of bytes (e.g. 2 * 2**30), got "
        f"{type(budget_bytes).__name__} {budget_bytes!r}.") from None
  if budget is not None and budget < 0:
    raise InvalidBudgetError(
        f"budget_bytes must be a non-negative number of bytes, got {budget_bytes!r}.")
  if isinstance(budget_bytes, float) and 0 < budget_bytes < 1:
    raise InvalidBudgetError(
        f"budget_bytes is a number of bytes (e.g. 2 * 2**30), got {budget_bytes!r}, which "
        f"reads as a share: for a share of the activations use jaxremat.fit(..., "
        f"memory_budget={budget_bytes!r}).")
  return budget


def check_float_params(params: Any) -> None:
  """Raises where ``params`` holds no float array: nothing to differentiate."""
  leaves = jax.tree_util.tree_leaves(params)
  if not any(_compat.is_float(x) for x in leaves):
    dtypes = sorted({str(getattr(x, "dtype", type(x).__name__)) for x in leaves})
    held = f"its leaves are of dtypes {dtypes}" if leaves else "it is empty"
    raise EmptyModelError(
        f"the parameters hold no float array ({held}): the training step differentiates "
        "nothing, so it has no backward pass and nothing to keep or recompute. Pass the "
        "trainable parameters (the variables model.init returns, or an nnx module with "
        "nnx.Param state).")


def check_float_output(traced: TracedChain) -> None:
  outs = [getattr(v, "aval", None) for v in traced.outvars]
  if not any(_compat.is_float(aval) for aval in outs):
    dtypes = sorted({str(getattr(aval, "dtype", "?")) for aval in outs})
    raise UnsupportedModelError(
        f"the model's outputs are all of non-float dtypes {dtypes}: there is no gradient "
        "to take through them, so nothing to checkpoint. Return the float values the loss "
        "is computed from (e.g. logits) and take argmax or round outside the model.")


def fixed_bytes(params: Any, batch: Any, arrays: Any) -> int:
  """Bytes held through the whole step: params, batch, array kwargs, parameter gradients."""
  return _tree_bytes(params) + _tree_bytes(batch) + _tree_bytes(arrays) + _tree_bytes(
      params, floats_only=True)


def _tree_bytes(tree: Any, floats_only: bool = False) -> int:
  return sum(_compat.aval_bytes(x) for x in jax.tree_util.tree_leaves(tree)
             if not floats_only or _compat.is_float(x))


def check_time_steps(time_steps: bool | None, verify: bool, target: Target | None,
                      params: Any, batch: Any) -> bool:
  """Whether to time the fitting plans: ``time_steps``, by default when it can be done."""
  abstract = any(isinstance(x, jax.ShapeDtypeStruct) for x in jax.tree.leaves((params, batch)))
  if time_steps is None:
    return verify and target is None and not abstract
  if time_steps and (not verify or target is not None or abstract):
    why = ("verify=False compiles nothing" if not verify else
           f"the target {target.name} is compiled for, not run" if target is not None else
           "params or batch are jax.ShapeDtypeStructs, not arrays")
    raise InvalidArgumentError(
        f"time_steps=True runs the fitting plans on this machine, but {why}. Pass "
        "concrete arrays with verify=True and no target, or leave time_steps unset.")
  return bool(time_steps)


def _warn_if_unbatched(traced: TracedChain, batch: Any) -> None:
  """``BatchAxisWarning`` when no output of the model of rank one or more has the first
  axis of the batch's first array of rank one or more. An output whose first axis is 1
  (a mean over the batch, keeping its axis) says nothing."""
  leaves = [x for x in jax.tree_util.tree_leaves(batch) if getattr(x, "ndim", 0)]
  if not leaves:
    return
  shape = tuple(leaves[0].shape)
  outs = [tuple(v.aval.shape) for v in traced.outvars if hasattr(v, "aval")]
  outs = [s for s in outs if s and s[0] != 1]
  if outs and all(s[0] != shape[0] for s in outs):
    warnings.warn(BatchAxisWarning(
        f"the model's output has shape {outs[0]}, whose first axis is not the batch's "
        f"first ({shape[0]}): flax layers read an input without its batch axis as one "
        f"example, and the plan is for that. If the batch's {shape} is one example, pass "
        f"a batch of them: shape (N, {', '.join(map(str, shape))})."), stacklevel=4)
