"""The drop-in function ``apply`` returns: the model run segment by segment under a plan."""

from __future__ import annotations

import warnings
from collections.abc import Callable
from typing import Any

import jax
import numpy as np

from jaxremat._api.compile import warn_if_barriers_dropped
from jaxremat._backends.policy_options import scan_policy
from jaxremat._errors import InputMismatchError, InvalidArgumentError, JaxrematError
from jaxremat._jaxpr import scan as _scan
from jaxremat._jaxpr.emit import emit, has_barriers
from jaxremat._jaxpr.regroup import own_work_path
from jaxremat._jaxpr.raised import RAISED_NOTE
from jaxremat._jaxpr.trace import PRIVATE_KWARGS, TracedChain, split_kwargs, trace
from jaxremat._model.chain import Plan
from jaxremat._model.policy_plan import PolicyPlan

InputKey = tuple[Any, ...]  # structures, shapes and dtypes of params, batch and kwargs


def input_key(params: Any, batch: Any, kwargs: dict[str, Any]) -> InputKey:
  """What a trace of the model depends on: tree structures, shapes, dtypes, static kwargs."""
  arrays, kw_tree, static = split_kwargs(kwargs)

  def avals(tree):
    leaves, treedef = jax.tree_util.tree_flatten(tree)
    shapes = [x.shape if isinstance(x, jax.ShapeDtypeStruct) else np.shape(x) for x in leaves]
    return treedef, tuple((tuple(s), str(x.dtype)) for s, x in zip(shapes, leaves))

  try:
    hash(static)
  except TypeError:
    static = tuple(map(id, static))
  return avals(params), avals(batch), avals(arrays), kw_tree, static


def _avals(key: tuple[Any, tuple[tuple[tuple[int, ...], str], ...]]) -> str:
  """A tree's leaves as ``[(2, 5) float32, ...]``."""
  return "[" + ", ".join(f"{shape} {dtype}" for shape, dtype in key[1]) + "]"


def _batch_text(now: tuple[Any, tuple], planned: tuple[Any, tuple]) -> str:
  """How a batch differs from the planned one: the leaves that differ, by path, where the
  structure is the same (``a batch whose ['tokens'] is float32 (8, 64), where the plan
  has int32 (8, 64)``); else both batches' leaves."""
  if now[0] != planned[0]:
    return (f"a batch of shapes and dtypes {_avals(now)} (the plan was made for "
            f"{_avals(planned)})")
  paths = [jax.tree_util.keystr(path) for path, _ in jax.tree_util.tree_flatten_with_path(
      jax.tree_util.tree_unflatten(now[0], range(len(now[1]))))[0]]
  if paths == [""]:
    (shape, dtype), (was, was_dtype) = now[1][0], planned[1][0]
    return f"a batch of {dtype} {shape} (the plan was made for {was_dtype} {was})"
  return "a batch whose " + "; ".join(
      f"{path} is {a[1]} {a[0]}, where the plan has {b[1]} {b[0]}"
      for path, a, b in zip(paths, now[1], planned[1]) if a != b)


class PlanReusedWarning(UserWarning):
  """A drop-in runs its plan for other keyword arguments than it was planned with."""


class _Array:
  def __init__(self, shape: tuple[int, ...], dtype: str):
    self.text = f"{dtype}[{', '.join(map(str, shape))}]"

  def __repr__(self) -> str:
    return self.text


def _kwargs_of(kwargs_key: InputKey) -> dict[str, Any] | None:
  """The keyword arguments of an ``input_key`` (from its third entry), arrays as
  ``_Array``s; None where they cannot be rebuilt."""
  (_, avals), kw_tree, static = kwargs_key
  arrays = iter(_Array(shape, dtype) for shape, dtype in avals)
  try:
    return jax.tree_util.tree_unflatten(kw_tree, [next(arrays) if s is None else s
                                                  for s in static])
  except (TypeError, ValueError, StopIteration):
    return None


def _kwargs_text(kwargs_key: InputKey) -> str:
  """The keyword arguments of an ``input_key``, arrays by dtype and shape: ``train=True,
  targets=int32[8, 64]``."""
  kwargs = _kwargs_of(kwargs_key)
  if kwargs is None:
    return "other keyword arguments"
  shown = [f"{k}={v!r:.80}" for k, v in kwargs.items()
           if not k.startswith(PRIVATE_KWARGS)]  # apply_nnx's model state: not the user's
  return ", ".join(shown) or "no keyword arguments"


def _traced_flags(now: InputKey, planned: InputKey) -> list[str]:
  """Keyword arguments planned with a Python value (``train=True``) that are arrays now:
  ``jax.jit`` traced them."""
  a, b = _kwargs_of(now), _kwargs_of(planned)
  if a is None or b is None:
    return []
  return [k for k, v in a.items() if isinstance(v, _Array) and k in b
          and not isinstance(b[k], _Array) and not isinstance(b[k], (dict, list, tuple))]


def _options(kwargs_key: InputKey) -> tuple[Any, ...]:
  """The keyword arguments of an ``input_key`` less their arrays' shapes and dtypes: their
  structure and Python values (``train=True``)."""
  (arrays_tree, _), kw_tree, static = kwargs_key
  return arrays_tree, kw_tree, static


def _same_layers(names: tuple[str, ...], planned: tuple[str, ...]) -> bool:
  """The same layers, one for one: modules by name; a module's work outside its children,
  named by its primitives after the module's path (``decoder/(reduce_sum,div)``), by the
  path and place (a cast adds a primitive to its name)."""
  return len(names) == len(planned) and all(
      a == b or (own_work_path(a) is not None and own_work_path(a) == own_work_path(b))
      for a, b in zip(names, planned))


_MISSING = object()  # the batch, when the drop-in is called with one positional argument


class DropIn:
  """``fn(params, batch, **kwargs)``: the model run segment by segment under the plan.

  New input shapes (another batch size, or per-example shapes under ``vmap``) re-trace
  the model; the plan is reused when the new trace has the same layers.
  """

  def __init__(self, model_fn: Callable[..., Any], plan: Plan | PolicyPlan, layer_depth: int | None,
               traced: TracedChain, key: InputKey, segments: tuple[int, ...] | None = None,
               scan_policies: tuple[str | None, ...] | None = None):
    self._model_fn = model_fn
    self._segments = segments
    self._scan_policies = scan_policies
    self._plan = plan
    self._layer_depth = layer_depth
    self._names = tuple(layer.name for layer in traced.layers)
    self._params_key, self._batch_key, self._kwargs_key = key[0], key[1], key[2:]
    self._cache = {key: (traced, emit(traced, plan))}

  @property
  def traced(self) -> TracedChain:
    """The trace the plan was made for."""
    return next(iter(self._cache.values()))[0]

  def _trace(self, params: Any, batch: Any, kwargs: dict[str, Any]) -> TracedChain:
    traced = trace(self._model_fn, params, batch, kwargs, self._layer_depth)
    if self._segments is not None:
      traced, _ = _scan.rewrite(traced, self._segments, self._scan_policies)
    return traced

  def __call__(self, params: Any, batch: Any = _MISSING, *args: Any, **kwargs: Any) -> Any:
    if batch is _MISSING:
      raise InvalidArgumentError(
          "the drop-in is called as the model_fn it was planned from, r.fn(params, batch, "
          "**kwargs) (flax: the variables dict, then the batch); got one positional "
          "argument. An nnx module is planned with jaxremat.apply_nnx, whose drop-in is "
          "called as r.fn(model, batch).")
    if args:
      raise InvalidArgumentError(
          f"the drop-in takes params, the batch and the model's other arguments by keyword, "
          f"as jaxremat planned them (e.g. r.fn(params, x, train=True)); got {len(args)} "
          "more positional argument(s): pass them by keyword.")
    key = input_key(params, batch, kwargs)
    if key not in self._cache:
      self._check(key, params)
      try:
        traced = self._trace(params, batch, kwargs)
      except JaxrematError:
        raise
      except Exception as err:
        flags = _traced_flags(key[2:], self._kwargs_key)
        if flags:  # a flag jit made an array: the model cannot branch on it
          raise InputMismatchError(
              f"the model fails when {', '.join(f'{k}=' for k in flags)} is an array "
              f"({_kwargs_text(key[2:])}), planned with a Python value "
              f"({_kwargs_text(self._kwargs_key)}): jax.jit traced it. "
              f"Mark it static (jaxremat.jit(f, static_argnames=({flags[0]!r},))) or "
              f"close over it: {type(err).__name__}: {err}") from err
        if key[1] != self._batch_key:  # another batch: likely the cause, say so
          raise InputMismatchError(
              f"the model fails on {_batch_text(key[1], self._batch_key)}: "
              f"{type(err).__name__}: {err}") from err
        # in place of the trace's note (how apply calls the model), which the same params
        # and batch passed already: the keyword arguments are what changed
        err.__notes__ = [n for n in err.__notes__ if not n.startswith(RAISED_NOTE)]
        err.add_note(
            "jaxremat: the model raised this when the drop-in traced it for other keyword "
            f"arguments than the plan was made for (same params and batch): the plan was "
            f"made with {_kwargs_text(self._kwargs_key)}, this call has "
            f"{_kwargs_text(key[2:])}.")
        raise
      names = tuple(layer.name for layer in traced.layers)
      was, now = _kwargs_text(self._kwargs_key), _kwargs_text(key[2:])
      if not _same_layers(names, self._names):
        kwargs_differ = (f" The keyword arguments differ: the plan was made with {was}, "
                         f"this call has {now}; plan with those of the training step "
                         "(train=, rngs=, mutable=)." if was != now else "")
        raise InputMismatchError(
            f"with these inputs the model has layers {list(names)}, but the plan was made "
            f"for {list(self._names)}; plan again with these inputs (the jaxremat call that "
            "made this drop-in: apply, fit, apply_nnx or fit_nnx), or, to "
            "evaluate without gradients (train=False), call the model itself: r.fn is for "
            "the training step." + kwargs_differ)
      if _options(key[2:]) != _options(self._kwargs_key):  # not arrays of another shape
        called = (f"the drop-in is called with {now}, but the plan was made with {was}"
                  if was != now else  # apply_nnx's module state: its static attributes
                  "the module's static attributes differ from those the plan was made with "
                  "(model.eval() or model.train(): a Dropout's or BatchNorm's mode)")
        warnings.warn(PlanReusedWarning(
            f"jaxremat: {called}. "
            "The model has the same layers, so the plan runs (same outputs and gradients), "
            "but it was chosen, and its figures (report(), measured_total_bytes) measured, "
            "for the call it was made for: a training step with dropout keeps more than an "
            "evaluation. Plan with the training step's keyword arguments (train=, rngs=, "
            "mutable=)."), stacklevel=2)
      self._cache[key] = (traced, emit(traced, self._plan))
    traced, run = self._cache[key]
    arrays, _, _ = split_kwargs(kwargs)
    flat = jax.tree_util.tree_leaves((params, batch, arrays))
    if has_barriers(self._plan):  # else nothing a CPU compile could undo
      warn_if_barriers_dropped(flat)
    return jax.tree_util.tree_unflatten(traced.out_tree, run(flat))

  def _check(self, key: InputKey, params: Any) -> None:
    """Params must have the plan's structure and shapes (dtypes may change: a cast to
    bfloat16 in the loss); the batch may change shapes, not structure."""
    want, got = self._params_key, key[0]
    if want[0] != got[0]:
      raise InputMismatchError("params do not have the structure the plan was made for: "
                               + _structure_difference(params, want[0]) + ".")
    paths = [jax.tree_util.keystr(p) for p, _ in jax.tree_util.tree_flatten_with_path(params)[0]]
    diffs = [f"params{path}: shape {g[0]} (expected {w[0]})"
             for path, w, g in zip(paths, want[1], got[1]) if w[0] != g[0]]
    if diffs:
      raise InputMismatchError(
          "params do not match the shapes the plan was made for: " + "; ".join(diffs[:5]) +
          ". Plan again with these params (jaxremat.apply).")
    if key[1][0] != self._batch_key[0]:
      raise InputMismatchError(
          f"batch has structure {key[1][0]}, but the plan was made for {self._batch_key[0]}.")


def _structure_difference(tree: Any, want: Any) -> str:
  """Where ``tree`` differs from the tree structure ``want``: the leaf paths it lacks and
  those it has beyond it (a few of each), e.g. a missing ``{'params': ...}`` wrapper."""
  def paths(t: Any) -> list[str]:
    return [jax.tree_util.keystr(p) for p, _ in jax.tree_util.tree_flatten_with_path(t)[0]]

  got, expected = paths(tree), paths(jax.tree_util.tree_unflatten(want, [0] * want.num_leaves))
  have, known = set(got), set(expected)
  missing = [p for p in expected if p not in have]
  extra = [p for p in got if p not in known]
  parts = [f"{len(found)} {'leaf' if len(found) == 1 else 'leaves'} {what}, e.g. "
           + ", ".join(f"params{p}" for p in found[:3])
           for what, found in (("missing", missing), ("not in the plan", extra)) if found]
  # the same leaves in other containers (a FrozenDict for a dict): the two structures
  return "; ".join(parts) or (f"its structure is {jax.tree_util.tree_structure(tree)}, the "
                              f"plan's {want}")


def policy_drop_in(model_fn: Callable[..., Any], plan: Plan | PolicyPlan,
                   layer_depth: int | None, written: TracedChain,
                   scans: tuple[_scan.ScanPlan, ...], key: InputKey,
                   per_iteration: bool = False) -> DropIn:
  """``plan``'s drop-in for the model as written (``written``), its scanned stacks
  segmented as ``scans`` say; a stack whose group keeps its products under a policy
  (``scan_policy``) runs one iteration per segment under it, and with ``per_iteration``
  every stack runs one iteration per segment (``nn.remat`` of each block in the scan)."""
  if not scans:
    return DropIn(model_fn, plan, layer_depth, written, key)
  segmented = frozenset(s.layer for s in scans if s.rematerialised)
  policies = {g.start: g.option.kind for g in getattr(plan, "groups", ())
              if scan_policy(g, segmented)}
  segments, kinds = _scan.layout(scans, policies)
  if per_iteration:
    segments = tuple(1 for _ in scans)
  return DropIn(model_fn, plan, layer_depth, _scan.rewrite(written, segments, kinds)[0], key,
                segments, kinds)
