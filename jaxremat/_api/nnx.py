"""``jaxremat.apply_nnx``: flax.nnx modules, traced with their module paths as name scopes."""

from __future__ import annotations

import collections
import contextlib
import contextvars
import dataclasses
import functools
import inspect
from typing import Any

import jax
from flax import nnx

from jaxremat._api import checks
from jaxremat._api.apply import apply
from jaxremat._api.fit import fit
from jaxremat._api.fitted import Fitted
from jaxremat._api.result import Remat
from jaxremat._errors import InputMismatchError, InvalidArgumentError
from jaxremat._jaxpr.trace import NNX_KWARGS

# Keyword arguments that carry the nnx graph and non-differentiated state through
# ``jaxremat.apply`` (the graph definition is static, the state's arrays are traced).
_GRAPHDEF = NNX_KWARGS + "graphdef"
_STATE = NNX_KWARGS + "state"
_WRT = NNX_KWARGS + "wrt"

# The keyword-only options of ``jaxremat.apply`` and ``jaxremat.fit``; apply_nnx and
# fit_nnx pass them on.
_APPLY_OPTIONS, _FIT_OPTIONS = (
    frozenset(p.name for p in inspect.signature(f).parameters.values()
              if p.kind is p.KEYWORD_ONLY) for f in (apply, fit))

# id(module) -> scope name, for the modules of the copy being traced (this context only).
_SCOPES: contextvars.ContextVar[dict[Any, str]] = contextvars.ContextVar("jaxremat_nnx_scopes")


@checks.positional("model", "batch")
def apply_nnx(
    model: nnx.Module,
    batch: Any = checks.REQUIRED,
    *,
    wrt: Any = nnx.Param,
    **kwargs: Any,
) -> Remat:
  """Chooses checkpoints for the flax.nnx module ``model`` and returns a drop-in call.

  nnx module calls leave no name stack in a jaxpr, so the model is traced on a private
  copy (``nnx.merge`` of its state) whose module calls each run in a
  ``jax.named_scope`` named by the module's attribute path: the model's class name,
  then e.g. ``blocks.0`` (an element of an ``nnx.List``), ``layers.3`` (a layer of an
  ``nnx.Sequential``) or ``head``. Layers are then found as for Flax linen: by default
  the model's child modules, in the order the model calls them, a large one split into
  its own (``transformer_blocks/layers.3`` of an ``nnx.Sequential``); work the model does
  outside any child (a residual add, ``nnx.relu`` in a ``Sequential``) forms layers of
  its own. Only ``__call__`` is scoped: another method of a child (``embed.attend``)
  counts as work of its caller. A stack ``nnx.scan`` runs (blocks ``nnx.vmap`` made) is
  one layer named by its attribute (``blocks``), where the model holds one module of its
  class. The model itself is not modified.

  The result's ``fn(model, batch, **call_kwargs)`` is a drop-in for
  ``model(batch, **call_kwargs)``: it runs the plan's segments under
  ``jax.checkpoint`` and writes the state the call changes (BatchNorm statistics, the
  counts of Dropout's rng streams) back into ``model`` as the plain call does. Use it in
  the training step on the model ``nnx.value_and_grad`` (or ``nnx.grad``) passes to the
  loss, under ``nnx.jit`` or ``jax.jit`` of a split/merge step::

    r = jaxremat.apply_nnx(model, x)
    def loss_fn(model, x, y):
      return optax.softmax_cross_entropy_with_integer_labels(r.fn(model, x), y).mean()
    loss, grads = nnx.value_and_grad(loss_fn)(model, x, y)
    optimizer.update(model, grads)

  For evaluation call ``model`` directly (nothing to checkpoint without gradients). After
  a mode switch such as ``model.eval()``, ``fn`` raises ``InputMismatchError`` where the
  switch changes the layers (a Dropout that is a layer of its own), and runs the model in
  the new mode under the plan where it does not (Dropout inside a block). On CPU compile
  the step with ``jaxremat.jit`` (or set ``XLA_FLAGS`` as README says) or XLA undoes the
  remat; a ``jax.jit`` given ``compiler_options={"xla_disable_hlo_passes":
  "cse_barrier_expander"}`` keeps it too, though ``fn``'s ``RematUndoneWarning`` cannot
  see that option.

  Args:
    model: the ``nnx.Module`` to train; it must be a chain of layers at the chosen
      granularity.
    batch: an example input (any pytree of arrays) with the shapes used in training;
      the model is called as ``model(batch, **call_kwargs)``.
    wrt: the nnx filter of the state that is differentiated (as in ``nnx.grad`` and
      ``nnx.Optimizer``): it counts as parameters (with gradients) in the byte
      figures; all other state (batch statistics, rng keys) is carried as traced
      arguments.
    **kwargs: the options of ``jaxremat.apply`` (``method``, ``budget_bytes``, ``loss_fn``,
      ``plan``, ``layer_depth``, ``refine``, ``verify``, ``calibrate``, ``profile``,
      ``scan_segment``), as there; every other keyword is passed to the model on every
      call (array leaves are traced).

  Returns:
    A ``Remat`` whose ``fn(model, batch, **call_kwargs)`` equals
    ``model(batch, **call_kwargs)``, state updates included.

  Raises:
    InvalidArgumentError: ``model`` is not an ``nnx.Module`` (a linen module goes to
      ``jaxremat.apply(model.apply, params, batch)``), or nnx objects among the inputs.
    NotAChainError, EmptyModelError, UnsupportedModelError, and the other errors of
      ``jaxremat.apply``.
  """
  checks.check_budget_keyword(kwargs, "apply")
  checks.check_given("apply_nnx(model, batch)", batch=batch)
  return _planned(apply, _APPLY_OPTIONS, model, batch, (), wrt, kwargs)


@checks.positional("model", "batch", "memory_budget")
def fit_nnx(
    model: nnx.Module,
    batch: Any = checks.REQUIRED,
    memory_budget: float | int = checks.REQUIRED,
    *,
    wrt: Any = nnx.Param,
    **kwargs: Any,
) -> Fitted:
  """``jaxremat.fit`` for the flax.nnx module ``model``: the fastest plan whose training
  step fits ``memory_budget``, per residual; traced as ``apply_nnx`` traces it.

  The result's ``fn(model, batch, **call_kwargs)`` is a drop-in for ``model(batch,
  **call_kwargs)`` as ``apply_nnx``'s is (state updates written back into ``model``)::

    f = jaxremat.fit_nnx(model, x, 0.5)  # half of the activations
    loss, grads = nnx.value_and_grad(lambda m: loss_of(f.fn(m, x), y))(model)

  Args:
    model, batch, wrt: as for ``apply_nnx``.
    memory_budget: as for ``fit``: a float in ``(0, 1]`` is a share of the activations,
      an int (or a float above 1) bytes.
    **kwargs: the options of ``jaxremat.fit`` (``layer_depth``, ``verify``, ``target``,
      ``time_steps``, ``loss_fn``), as there; every other keyword is passed to the model
      on every call (array leaves are traced).

  Raises:
    InvalidArgumentError: as for ``apply_nnx``; and the errors of ``jaxremat.fit``.
  """
  checks.check_budget_keyword(kwargs, "fit")
  checks.check_given("fit_nnx(model, batch, memory_budget)", batch=batch,
                     memory_budget=memory_budget)
  return _planned(fit, _FIT_OPTIONS, model, batch, (memory_budget,), wrt, kwargs)


def _planned(entry: Any, option_names: frozenset[str], model: nnx.Module, batch: Any,
             args: tuple[Any, ...], wrt: Any, kwargs: dict[str, Any]) -> Any:
  """``entry`` (apply or fit) on ``model`` split by ``wrt`` and called on a scoped copy;
  the result's ``fn`` takes the model."""
  _check_module(model)
  options = {k: kwargs.pop(k) for k in option_names & kwargs.keys()}
  checks.check_loss_fn(options.get("loss_fn"))
  if options.get("loss_fn") is not None:  # of the model's output, not of the state with it
    user_loss = options["loss_fn"]
    options["loss_fn"] = lambda out_and_state: user_loss(out_and_state[0])
  _check_no_nnx_objects(batch, kwargs)
  # flax types split(node, first, second) as a variadic tuple
  graphdef, params, rest = nnx.split(model, wrt, ...)  # type: ignore[misc]
  call_kwargs = {_GRAPHDEF: graphdef, _STATE: rest, _WRT: wrt, **kwargs}
  result = entry(_call_merged, params, batch, *args, **options, **call_kwargs)
  return dataclasses.replace(result, fn=_NnxDropIn(result.fn, wrt, graphdef, type(model),
                                                   f"jaxremat.{entry.__name__}_nnx"))


def _check_module(model: Any) -> None:
  if isinstance(model, nnx.Module):
    return
  hint = ""
  owner = getattr(model, "__self__", model)  # a bound method: its module
  if hasattr(owner, "apply") and hasattr(owner, "init"):
    hint = " For a Flax linen module use jaxremat.apply(model.apply, params, batch)."
  raise InvalidArgumentError(
      f"model must be a flax.nnx.Module, got {type(model).__name__}.{hint}")


def _check_no_nnx_objects(batch: Any, kwargs: dict[str, Any]) -> None:
  """nnx objects in the inputs (``rngs=`` at call time) would lose their state updates."""
  leaves = jax.tree_util.tree_leaves_with_path(
      {"batch": batch, **kwargs}, is_leaf=lambda x: isinstance(x, (nnx.Pytree, nnx.Variable)))
  bad = [jax.tree_util.keystr(p) for p, x in leaves if isinstance(x, (nnx.Pytree, nnx.Variable))]
  if bad:
    raise InvalidArgumentError(
        f"the model's inputs hold nnx objects at {', '.join(bad[:5])}: their state updates "
        "(e.g. an nnx.Rngs count) would be lost. Give them to the model at construction "
        "(nnx.Dropout(rate, rngs=rngs)) and pass only arrays (and static options) at call: "
        "a Dropout taking rngs at call takes a key array (rngs=jax.random.key(0)), a new "
        "key per step.")


def _call_merged(params: Any, batch: Any, **kwargs: Any) -> tuple[Any, Any]:
  """``model(batch, **kwargs)`` on a copy merged from state; returns (outputs, new state)."""
  graphdef, rest, wrt = kwargs.pop(_GRAPHDEF), kwargs.pop(_STATE), kwargs.pop(_WRT)
  model = nnx.merge(graphdef, params, rest)
  with _module_scopes(model):
    out = model(batch, **kwargs)
  # flax types split(node, first, second) as a variadic tuple
  _, _, new_rest = nnx.split(model, wrt, ...)  # type: ignore[misc]
  return out, new_rest


@contextlib.contextmanager
def _module_scopes(model: nnx.Module):
  """Runs every module call of ``model`` (a private copy) in a named scope of its path."""
  modules = [(path, m) for path, m in nnx.iter_modules(model) if callable(m)]  # not nnx.List
  names = _scope_names(modules, root=type(model).__name__)
  by_class = collections.Counter(type(m) for _, m in modules)
  # a module a transform slices (nnx.scan over blocks nnx.vmap made) runs as a new
  # object of its class: named as the model's one module of that class, where it is one
  for _, m in modules:
    if by_class[type(m)] == 1:
      names[_scoped_class(type(m))] = names[id(m)]
  originals = [(m, type(m)) for _, m in modules]
  token = _SCOPES.set(names)
  try:
    for module, cls in originals:
      object.__setattr__(module, "__class__", _scoped_class(cls))
    yield
  finally:
    for module, cls in originals:
      object.__setattr__(module, "__class__", cls)
    _SCOPES.reset(token)


def _scope_names(modules: list[tuple[tuple[Any, ...], Any]], root: str) -> dict[Any, str]:
  """Per module (by ``id``), its scope: its attribute path below the nearest module above
  it that is called (``root`` for the top one)."""
  scoped = {path for path, _ in modules}
  names: dict[Any, str] = {}
  for path, module in modules:
    parent = next((path[:k] for k in range(len(path) - 1, -1, -1) if path[:k] in scoped), None)
    names[id(module)] = (root if parent is None
                         else ".".join(str(k) for k in path[len(parent):]))
  return names


@functools.cache
def _scoped_class(cls: type) -> type:
  """A subclass of ``cls`` whose ``__call__`` runs in the instance's named scope."""

  def __call__(self, *args, **kwargs):
    names = _SCOPES.get({})
    name = names.get(id(self))
    if name is None and (name := names.get(type(self))) is not None:  # a transform's slice
      children = [(p, m) for p, m in nnx.iter_modules(self) if callable(m)]
      names = {**names, **_scope_names(children, name)}
    if name is None:
      return super(scoped, self).__call__(*args, **kwargs)
    token = _SCOPES.set(names)
    try:
      with jax.named_scope(name):
        return super(scoped, self).__call__(*args, **kwargs)
    finally:
      _SCOPES.reset(token)

  scoped: type[Any] = type(cls.__name__, (cls,), {
      "__call__": __call__, "__slots__": (), "__module__": cls.__module__,
      "__qualname__": cls.__qualname__})
  return scoped


class _NnxDropIn:
  """``fn(model, batch, **kwargs)``: ``model(batch, **kwargs)`` run under the plan.

  The model's state is split by ``wrt``; the state the call changes is written back into
  ``model`` with ``nnx.update``.
  """

  def __init__(self, drop_in, wrt, graphdef, model_type, made_by: str):
    self._drop_in = drop_in
    self._wrt = wrt
    self._graphdef = graphdef
    self._model_type = model_type
    self._made_by = made_by  # what to call again on the model in another mode

  def __call__(self, model: nnx.Module, batch: Any = checks.REQUIRED, **kwargs: Any) -> Any:
    if batch is checks.REQUIRED or not isinstance(model, nnx.Module):
      got = ("one positional argument" if batch is checks.REQUIRED else
             f"{type(model).__name__}, then {type(batch).__name__}")
      raise InvalidArgumentError(
          f"the drop-in {self._made_by} returns is called as r.fn(model, batch, **kwargs): "
          f"the {self._model_type.__name__} module (its state is read from it and updated "
          f"in it), then the batch; got {got}.")
    _check_no_nnx_objects(batch, kwargs)
    if type(model) is not self._model_type:
      raise InputMismatchError(
          f"model is a {type(model).__name__}, but the plan was made for a "
          f"{self._model_type.__name__}.")
    # flax types split(node, first, second) as a variadic tuple
    graphdef, params, rest = nnx.split(model, self._wrt, ...)  # type: ignore[misc]
    try:
      out, new_rest = self._drop_in(
          params, batch, **{_GRAPHDEF: graphdef, _STATE: rest, _WRT: self._wrt}, **kwargs)
    except InputMismatchError as err:
      if graphdef == self._graphdef:
        raise
      raise InputMismatchError(
          "the model's static attributes differ from the ones the plan was made for (e.g. "
          "model.eval() turns Dropout off) and so do its layers: evaluate with model(x) "
          f"directly (nothing to checkpoint without gradients), or call {self._made_by} "
          "on the model in this mode.") from err
    nnx.update(model, new_rest)
    return out
