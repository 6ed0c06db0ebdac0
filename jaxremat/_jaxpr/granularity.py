"""Which equations form a layer: groups by Flax name stack, at a fixed or an automatic depth.

A layer is a run of consecutive equations whose name stacks (module paths) share a
prefix. With a fixed ``layer_depth`` the prefix is that many components below the root.
Consecutive calls of one module (a block whose weights are shared) are a layer each.
By default (``decompose``) the layers start as the root module's children, and a child
that holds a large share of the model's activation bytes is replaced by its own
children, recursively and at mixed depth, as long as the layers stay a chain: the
blocks of a transformer's ``Encoder``, of an ``nnx.Sequential`` or of a ResNet stage
become the layers, wherever they sit (a U-Net's too, planned as a graph). A split whose
blocks all read a value made before them besides their chain (a decoder's blocks, each
cross-attending to the encoder's output) is kept too, and the layers planned as a graph.
"""

from __future__ import annotations

import dataclasses
import os
import re
from collections.abc import Sequence
from typing import Any

import jax

from jaxremat._jaxpr import compat as _compat
from jaxremat._jaxpr.module_tree import ModuleTree, activation_bytes
from jaxremat._jaxpr.regroup import (HOIST_SHARE, Group, attach_output_work, first_skip,
                                     hoist_values, shared_inputs)

#: A module is split into its children when it makes at least this share of the model's
#: activation bytes (``activation_bytes``).
DESCEND_SHARE = 1 / 8


Key = tuple[str, ...]  # a module path; ("", *stack) for equations outside any child


@dataclasses.dataclass(frozen=True)
class Decomposition:
  """The layers chosen by ``decompose``.

  Attributes:
    prelude: equations moved before the chain (parameter-only values, small batch-only
      values read across layers).
    groups: the layers, as (name, equations), none empty.
    is_chain: every layer reads only the batch, invariants and the layer before it.
    description: which modules were split and why, in a sentence.
  """

  prelude: tuple
  groups: tuple[Group, ...]
  is_chain: bool
  description: str


def base_depth(stacks: Sequence[Key]) -> int:
  """1 when every equation sits under one root module (its children are the layers), else 0."""
  roots = {s[0] for s in stacks if s}
  return 1 if len(roots) == 1 and all(stacks) else 0


def group(eqns: Sequence[Any], layer_depth: int) -> list[Group]:
  """Groups consecutive equations by their name stack ``layer_depth`` components below
  the root into named layers (the fixed ``layer_depth`` of ``jaxremat.apply``)."""
  stacks = [_compat.module_path(e) for e in eqns]
  keyed = _keyed(eqns, stacks, layer_depth, frozenset())
  # a module's own work, below the root's (whose ops keep their primitives' names)
  modules = {key[1:] for key, _ in keyed if key[0] == "" and len(key) > 2}
  parents = {s[:n] for s in stacks for n in range(1, len(s))}
  return _named(keyed, 1 if layer_depth else 0, frozenset(modules - parents))


def decompose(eqns: Sequence[Any], invariant: set, batch_vars: Sequence[Any],
              param_vars: Sequence[Any], outvars: Sequence[Any] = ()) -> Decomposition:
  """The layers that serve remat best: the root's children, split where they are large.

  A module is split into its children (its child modules; its own equations between
  them form layers of their own) when it makes at least ``DESCEND_SHARE`` of the
  model's activation bytes, or when a sibling of the same name but for a trailing
  index (``layer1``, ``layer2``; ``blocks.0``, ``blocks.1``) was split; a module with
  a single child is looked through, and so is the root's only child module (split
  whether its layers are a chain or a graph, as the root's children are). Other splits
  are kept only when the layers stay a chain once small batch-only values read across
  layers (``HOIST_SHARE``) join the prelude; otherwise the module, and its like-named
  siblings, stay whole. When the root's children
  are a graph already (a U-Net's skips from its encoder to its decoder), a split is kept
  when the module's layers and the one before them form a chain (an Encoder's blocks),
  not when it holds a skip of its own (a residual block). A split (looking down to two
  levels below the module) whose layers read, besides the layer before them, only values
  made before the module that two or more of them read (``shared_inputs``: a decoder's
  blocks and the encoder's output) is kept, and the layers are a graph from then on.
  Largest modules go first.
  Shares are ratios of shapes, so another batch size gives the same layers.

  Args:
    eqns: the model's equations, in order.
    invariant: values every layer may read (parameters, batch, kwargs, constants).
    batch_vars: the batch's values (they vary; activation bytes are counted from them).
    param_vars: the parameters' values (what depends on them is an activation, never
      hoisted as a batch-only value).
    outvars: the model's outputs (work that only they read joins its inputs' layer:
      ``attach_output_work``).
  """
  stacks = [_compat.module_path(e) for e in eqns]
  depth = base_depth(stacks)
  weights = activation_bytes(eqns, batch_vars)
  total = max(1, sum(weights))
  tree = ModuleTree(stacks, weights, depth)

  def evaluate(expanded: frozenset, split: Key = ()
               ) -> tuple[Decomposition, list[Key], bool, set]:
    """The layers with the modules of ``expanded`` split, their modules, whether the
    layers of ``split`` form a chain with the layer before them (a graph's splits), and
    the values they read beside their chain (``shared_inputs``)."""
    keyed = _keyed(eqns, stacks, depth, expanded)
    groups = _named(keyed, depth)
    prelude, groups, moved = hoist_values(groups, invariant, batch_vars, param_vars,
                                          HOIST_SHARE * total)
    known = invariant | {v for e in prelude for v in e.outvars}
    groups = attach_output_work(groups, known, outvars)
    chain = first_skip(groups, known) is None
    modules = [key for key, _ in keyed if key[0]]
    inside = [i for i, (key, _) in enumerate(keyed)
              if split and (key if key[0] else key[1:])[:len(split)] == split]
    window = keyed[max(inside[0] - 1, 0):inside[-1] + 1] if inside else []
    own_chain = (bool(inside) and inside == list(range(inside[0], inside[-1] + 1))
                 and first_skip([("/".join(k), e) for k, e in window], known) is None)
    beside = shared_inputs([("", e) for _, e in keyed], inside[0], inside[-1],
                           known) if inside else set()
    return (Decomposition(tuple(prelude), tuple(groups), chain, _hoist_note(moved)), modules,
            own_chain, beside)

  best, modules, _, _ = evaluate(frozenset())
  expanded: frozenset = frozenset()
  split: list[Key] = []
  if (len(modules) == 1 and tree.divisible(modules[0])
      and tree.weight(modules[0]) >= DESCEND_SHARE * total):
    # the model is one module (a wrapper; a subclass calling super().__call__) and, at
    # most, work of the root's own: that module's children are the model's layers, a
    # chain or a graph, as the root's are (kept whole, it leaves nothing to plan)
    split.append(modules[0])
    expanded = tree.expansion(modules[0])
    best, modules, _, _ = evaluate(expanded)
  graph = not best.is_chain  # then splits are judged by their own layers (docstring)
  shared: set = set()  # values the blocks of the splits kept so far read beside their chain

  def beside_split(key: Key, keys: frozenset, trial: Decomposition, trial_modules: list[Key],
                   beside: set) -> tuple[frozenset, Decomposition, list[Key], set] | None:
    """``key`` split (``keys``, evaluated as ``trial``), with its heavy descendants down to
    two levels more, where its layers then read only the layer before them, invariants
    and values made before ``key`` that two or more of them read (``shared_inputs``: a
    decoder's blocks, each reading the encoder's output); None where no such split is
    found."""
    for level in range(3):
      known = invariant | {v for e in trial.prelude for v in e.outvars} | shared | beside
      if beside and first_skip(trial.groups, known) is None:
        return keys, trial, trial_modules, beside
      heavy = [k for k in trial_modules if k[:len(key)] == key and k not in keys
               and tree.divisible(k) and tree.weight(k) >= DESCEND_SHARE * total]
      if not heavy or level == 2:
        return None
      keys = keys.union(*(tree.expansion(k) for k in heavy))
      trial, trial_modules, _, beside = evaluate(expanded | keys, key)
    return None

  kept: list[Key] = []
  decided: dict[Key, bool] = {}  # (parent, stem) -> whether that kind of module was split
  while True:
    candidates = [k for k in modules if k not in kept and tree.divisible(k)
                  and decided.get(_kind(k), tree.weight(k) >= DESCEND_SHARE * total)]
    if not candidates:
      break
    key = max(candidates, key=tree.weight)
    keys = tree.expansion(key)
    trial, trial_modules, own_chain, beside = evaluate(expanded | keys, key)
    accepted = trial.is_chain or (graph and own_chain)
    if not accepted and (found := beside_split(key, keys, trial, trial_modules,
                                                 beside)) is not None:
      keys, trial, trial_modules, beside = found
      shared |= beside
      accepted = graph = True  # a graph now: later splits are judged by their own layers
    if accepted:
      expanded, best, modules = expanded | keys, trial, trial_modules
      split.append(key)
    else:
      kept.append(key)
    decided.setdefault(_kind(key), accepted)
  return dataclasses.replace(best, description=_describe(
      split, kept, modules, tree, total, depth, len(best.groups), graph) + best.description)


def _kind(key: Key) -> Key:
  """The module's parent path and its name without a trailing index: siblings of one kind."""
  return (*key[:-1], re.sub(r"[._]?\d+$", "", key[-1]))


def _keyed(eqns: Sequence[Any], stacks: Sequence[Key], depth: int,
           expanded: frozenset) -> list[tuple[Key, list]]:
  """Runs of consecutive equations of one layer key: the stack cut ``depth`` components
  below the root and one further below each module in ``expanded``; ``("", *stack)``
  for equations of a module that is split (or of the root) outside its children."""
  runs: list[tuple[Key, list, list]] = []
  for eqn, stack in zip(eqns, stacks):
    k = depth
    while len(stack) > k and stack[:k + 1] in expanded:
      k += 1
    key = stack[:k + 1] if len(stack) > k else ("", *stack)
    if runs and runs[-1][0] == key:
      runs[-1][1].append(eqn)
      runs[-1][2].append(stack)
    else:
      runs.append((key, [eqn], [stack]))
  groups: list[tuple[Key, list]] = []
  for key, run, run_stacks in runs:
    period = _call_period(run, run_stacks, key) if key[0] else len(run)
    groups.extend((key, run[i:i + period]) for i in range(0, len(run), period))
  return groups


def _call_period(eqns: Sequence[Any], stacks: Sequence[Key], key: Key) -> int:
  """The equations of one call when ``eqns`` are consecutive calls of the module ``key``,
  each reading the one before (a block whose weights are shared, called in a loop): the
  least period over which the equations repeat, primitive and module path alike, whose
  equations sit in ``key`` itself (not all in one child: a child called twice within one
  call), with work of a child module or a checkpoint call (``nn.remat(Block)``) in it;
  ``len(eqns)`` when there is none."""
  n = len(eqns)
  for period in range(1, n // 2 + 1):
    head = stacks[:period]
    if (n % period or len(os.path.commonprefix(list(head))) != len(key)
        or not any(len(s) > len(key) or e.primitive.name in _compat.REMAT_PRIMITIVES
                   for s, e in zip(head, eqns))):
      continue
    if all(stacks[i] == stacks[i - period]
           and eqns[i].primitive is eqns[i - period].primitive for i in range(period, n)):
      return period if _chained(eqns, period) else n
  return n


def _chained(eqns: Sequence[Any], period: int) -> bool:
  """Whether each ``period`` of ``eqns`` reads a value the one before it made (calls in
  a loop, not side by side on other inputs: a Siamese encoder's two calls)."""
  for start in range(period, len(eqns), period):
    made = {v for e in eqns[start - period:start] for v in e.outvars}
    if not any(v in made for e in eqns[start:start + period] for v in e.invars
               if not isinstance(v, _compat.Literal)):
      return False
  return True


def _named(keyed: list[tuple[Key, list]], drop: int,
           leaves: frozenset = frozenset()) -> list[Group]:
  """Names each group by its module path less the first ``drop`` components (the implied
  root); a group outside any child by its primitives after its module's path, or by
  that path alone when the module is in ``leaves`` (it has no child: a ``Conv`` above a
  fixed ``layer_depth``); repeated names get ``#2``, ``#3``."""
  named = []
  seen: dict[str, int] = {}
  for key, eqns in keyed:
    if key[0] == "" and key[1:] in leaves:
      name = "/".join(key[1 + drop:])
    elif key[0] == "":
      prims = list(dict.fromkeys(_eqn_label(e) for e in eqns))
      name = _scanned_module(eqns) or (
          "(" + ",".join(prims[:3]) + (",..." if len(prims) > 3 else "") + ")")
      where = "/".join(key[1 + drop:])
      name = f"{where}/{name}" if where else name
    else:
      name = "/".join(key[drop:])
    seen[name] = seen.get(name, 0) + 1
    named.append((name if seen[name] == 1 else f"{name}#{seen[name]}", eqns))
  return named


def _scanned_module(eqns: Sequence[Any]) -> str | None:
  """The module a scan among ``eqns`` runs (``nn.scan(Block)(name="layers")``: its body's
  name stacks start at ``layers``), when its body runs one; else None."""
  for eqn in eqns:
    if eqn.primitive.name == "scan":
      firsts = _first_names(eqn.params["jaxpr"].jaxpr.eqns)
      if len(firsts) == 1:
        return firsts.pop()
  return None


def _first_names(eqns: Sequence[Any]) -> set[str]:
  """The first name-stack components of ``eqns``, looking inside an equation without a
  name stack that holds a jaxpr (``nn.remat(Block)`` in the scan: one checkpoint)."""
  firsts = set()
  for e in eqns:
    inner = e.params.get("jaxpr")
    inner = getattr(inner, "jaxpr", inner)  # a ClosedJaxpr's, or a Jaxpr
    if stack := _compat.name_stack(e):
      firsts.add(stack[0])
    elif hasattr(inner, "eqns"):
      firsts |= _first_names(inner.eqns)
  return firsts


def _eqn_label(eqn: Any) -> str:
  if eqn.primitive.name in ("custom_jvp_call", "custom_vjp_call", "pjit", "jit"):
    for key in ("call_jaxpr", "jaxpr", "fun_jaxpr"):
      inner = eqn.params.get(key)
      info = getattr(getattr(inner, "jaxpr", inner), "debug_info", None)
      src = getattr(info, "func_src_info", None)
      if src:
        return src.split(" ")[0]
  return eqn.primitive.name


def _describe(split: list[Key], kept: list[Key], modules: list[Key], tree: ModuleTree,
              total: int, depth: int, layers: int, graph: bool) -> str:
  """``decompose``'s choice in a sentence: the modules split (with their share of the
  activation bytes), the layers' depth, and the modules kept whole; for a ``graph``
  (a layer reads a value made two or more layers before it), that it is one."""
  def path(key: Key) -> str:
    return "/".join(key[depth:])

  if not modules:
    text = f"no module in the trace's name stacks ({layers} layer(s) of work outside any)"
  elif not split:
    text = f"the root module's children ({layers} layers)"
  else:
    depths = {len(k) for k in modules}
    where = f"depth {depths.pop() - depth}" if len(depths) == 1 else "mixed depth"
    parts = [f"'{path(k)}' ({tree.weight(k) / total:.0%}"
             + (" of the activation bytes)" if i == 0 else ")") for i, k in enumerate(split)]
    text = f"descended into {', '.join(parts)}: {layers} layers at {where}"
  runs = {k: modules.count(k) for k in dict.fromkeys(modules)}
  called = [f"'{path(k)}' ({n} calls)" for k, n in runs.items() if n > 1]
  if called:
    text += f"; a layer per call of {', '.join(called)}"
  whole = []
  for key in kept:
    alike = [f"'{path(k)}'" for k in dict.fromkeys(modules)
             if k != key and _kind(k) == _kind(key)]
    others = ", ".join(alike[:3]) + (f" and {len(alike) - 3} more" if len(alike) > 3 else "")
    whole.append(f"'{path(key)}'" + (f" and those like it ({others})" if alike else ""))
  if whole:
    text += (f"; kept whole: {', '.join(whole)} (were they split into their children, a "
             "layer would read a value made two or more layers before it: a residual "
             "connection)")
  if graph:
    text += ("; planned as a graph: a layer reads a value made two or more layers before "
             "it (a skip connection across layers)")
  return text


def keyword_values_note(prelude: Sequence[Any], read: set, keywords: dict[Any, str]) -> str:
  """The note on values the layers read that the prelude computes from the model's
  keyword arrays (``keywords``: their input variables by keyword): they run before the
  layers, outside the plan, and are held for the whole step (a captioner's embedding of
  ``tokens=``); ``""`` when there are none."""
  derived: dict[Any, set[str]] = {v: {k} for v, k in keywords.items()}
  for eqn in prelude:
    sources = set().union(*(derived.get(v, set()) for v in eqn.invars
                            if not isinstance(v, _compat.Literal)))
    if sources:
      derived.update((v, sources) for v in eqn.outvars)
  held = [v for v in dict.fromkeys(v for e in prelude for v in e.outvars)
          if v in read and v in derived
          and not jax.dtypes.issubdtype(v.aval.dtype, jax.dtypes.extended)]
  if not held:
    return ""
  names = sorted(set().union(*(derived[v] for v in held)))
  size = sum(_compat.aval_bytes(v.aval) for v in held)
  return (f"; {len(held)} value(s) computed from {', '.join(f'{k}=' for k in names)} before "
          f"the layers ({size} bytes) run outside the plan and are held for the whole step")


def _hoist_note(hoisted: list) -> str:
  if not hoisted:
    return ""
  size = sum(_compat.aval_bytes(v.aval) for v in hoisted)
  return (f"; {len(hoisted)} value(s) computed from the batch alone ({size} bytes, e.g. an "
          "attention mask) and read across layers moved into the prelude")
