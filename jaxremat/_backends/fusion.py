"""The fusion model every platform shares: which of a layer's residuals XLA keeps."""

from __future__ import annotations

from jaxremat._jaxpr import compat as _compat


def as_kept_by_xla(jaxpr, res_atoms, out_atoms, written: frozenset | set = frozenset()) -> list:
  """The values XLA keeps for the backward pass in place of ``res_atoms``.

  A residual that a fusible op makes and that no op reads from memory, such as relu's
  mask ``x > 0``, tanh's ``1 - y`` or dropout's mask (read by the forward's select, a
  fusible op too), is made inside each fusion that reads it, in the forward and in the
  backward: XLA keeps the op's operands instead (here ``x``, ``y``, the random bits'
  float), which may be larger (a bool mask becomes its f32 source) or smaller (a
  broadcast becomes its source vector). Applied recursively through fusible producers
  read by fusible ops alone, once (an expensive op, ``tanh``, is made in one fusion
  only) or by several (a cheap one, made again in each). A
  kept value that XLA can recompute from the other kept values (``_recomputable``) is
  dropped, unless a forward op or a library fusion of the backward (``written``, CPU)
  reads it from memory: GELU's ``0.5 * (1 + tanh)`` goes, BatchNorm's ``x - mean``
  stays.
  """
  producer = {v: e for e in jaxpr.eqns for v in e.outvars}
  uses: dict = {}
  # Values some op reads from memory: a forward op, or (if the VJP saves them) the
  # backward's library fusions (``written``).
  written = (set(written) & set(_compat.non_literals(res_atoms))) | set(jaxpr.invars)
  for e in jaxpr.eqns:
    for v in e.invars:
      if not isinstance(v, _compat.Literal):
        uses[v] = uses.get(v, 0) + 1
        if not _compat.fusible(e):
          written.add(v)
  forward_out = {v for v in out_atoms if not isinstance(v, _compat.Literal)}

  memo: dict = {}

  def kept(atom, readers: int) -> list:
    """What XLA keeps of ``atom``, which ``readers`` fusions read: made in each of them
    (none reading it from memory; an expensive op only where one fusion reads it), its
    operands, each read by its other readers and by those fusions; else ``atom``."""
    if isinstance(atom, _compat.Literal):
      return [atom]
    if (atom, readers > 1) in memo:
      return memo[atom, readers > 1]
    eqn = producer.get(atom)
    if (eqn is None or atom in written or atom in forward_out
        or eqn.primitive.name not in _compat.FUSIBLE_PRIMITIVES
        or (readers > 1 and eqn.primitive.name not in _compat.CHEAP_PRIMITIVES)):
      found = [atom]
    else:
      found = [k for v in eqn.invars if not isinstance(v, _compat.Literal)
               for k in kept(v, uses.get(v, 0) - 1 + readers)]
    memo[atom, readers > 1] = found
    return found

  # a residual's readers: its forward ones and the backward's fusion
  kept_atoms = list(dict.fromkeys(
      k for atom in res_atoms
      for k in kept(atom, 1 if isinstance(atom, _compat.Literal) else uses.get(atom, 0) + 1)))
  held = set(kept_atoms) | set(jaxpr.invars) | set(jaxpr.constvars)
  out = []
  for k in kept_atoms:
    if k not in forward_out and k not in written and _recomputable(k, producer, held - {k}):
      held.discard(k)
    else:
      out.append(k)
  return out


def _recomputable(atom, producer: dict, held: set) -> bool:
  """True when cheap fusible ops make ``atom`` from held values and small ones (a
  tenth of its size or less, such as broadcast statistics): XLA then recomputes it in
  the backward fusion rather than keeping it (relu after BatchNorm reads the normalised
  value BatchNorm's own residuals give back)."""
  size = _compat.aval_bytes(atom.aval)

  def made_cheaply(v) -> bool:
    eqn = producer.get(v)
    return (eqn is not None and eqn.primitive.name in _compat.CHEAP_PRIMITIVES
            and all(map(ok, eqn.invars)))

  def ok(v) -> bool:
    return (isinstance(v, _compat.Literal) or v in held or 10 * _compat.aval_bytes(v.aval) <= size
            or made_cheaply(v))

  return made_cheaply(atom)
