"""Flax's ``nn.remat_scan``: its nested scans read as one scan over all its blocks."""

from __future__ import annotations

import dataclasses

import jax
from jax.extend import core as jex_core

from jaxremat._jaxpr import compat as _compat
from jaxremat._jaxpr.trace import TracedChain


def flattened(traced: TracedChain) -> TracedChain:
  """``traced`` with each nested stack of Flax's ``nn.remat_scan`` as one scan (``flat``)."""
  layers = list(traced.layers)
  for i, layer in enumerate(layers):
    found = [flat(eqn) for eqn in layer.eqns]
    if any(found):
      eqns = [e for eqn, made in zip(layer.eqns, found) for e in (made or [eqn])]
      layers[i] = dataclasses.replace(layer, eqns=tuple(eqns))
  return dataclasses.replace(traced, layers=tuple(layers))


def flat(eqn: _compat.JaxprEqn) -> list[_compat.JaxprEqn] | None:
  """Equations computing what ``eqn`` computes as one scan over ``n1 * n2`` iterations,
  where ``eqn`` is a scan over ``n1`` whose body is a ``jax.checkpoint`` of a scan over
  ``n2`` of the same carry, its stacked xs rows of ``eqn``'s (``nn.remat_scan`` of
  ``lengths=(n1, n2)``); else None. The inner scan's consts are ``eqn``'s or computed
  from them and literals (an attention's scale). The user's remat of each outer
  iteration is dropped: jaxremat segments the stack of ``n1 * n2`` blocks itself. The xs are
  reshaped from ``[n1, n2, ...]`` to ``[n1 * n2, ...]`` before the scan."""
  if eqn.primitive.name != "scan" or eqn.params["reverse"]:
    return None
  body = eqn.params["jaxpr"].jaxpr
  nc, ncarry, n1 = eqn.params["num_consts"], eqn.params["num_carry"], eqn.params["length"]
  work = [e for e in body.eqns if e.outvars]
  if (len(work) != 1 or work[0].primitive.name not in _compat.REMAT_PRIMITIVES
      or list(work[0].outvars) != list(body.outvars) or len(body.outvars) != ncarry):
    return None
  remat, inner = work[0], work[0].params["jaxpr"]
  inner = getattr(inner, "jaxpr", inner)
  scans = [i for i, e in enumerate(inner.eqns) if e.primitive.name == "scan"]
  if len(scans) != 1 or list(inner.eqns[scans[0]].outvars) != list(inner.outvars):
    return None
  scan = inner.eqns[scans[0]]
  if scan.params["reverse"] or scan.params["num_carry"] != ncarry:
    return None
  position = {v: i for i, v in enumerate(body.invars)}
  outer = {v: position.get(o, -1) for v, o in zip(inner.invars, remat.invars)}
  mc, n2 = scan.params["num_consts"], scan.params["length"]
  carry = [outer.get(v, -1) for v in scan.invars[mc:mc + ncarry]]
  xs = [outer.get(v, -1) for v in scan.invars[mc + ncarry:]]
  if carry != list(range(nc, nc + ncarry)) or any(i < nc + ncarry for i in xs):
    return None
  made_consts = [v for v in scan.invars[:mc] if v not in outer]  # computed in the body
  needed = set(made_consts)
  kept: list[_compat.JaxprEqn] = []
  for e in reversed(inner.eqns[:scans[0]]):
    if needed & set(e.outvars):
      kept.insert(0, e)
      needed |= {v for v in e.invars if not isinstance(v, _compat.Literal)}
  reads = [v for v in inner.invars if v in needed]
  if any(outer[v] >= nc or outer[v] < 0 for v in reads) or any(
      outer[v] >= nc or outer[v] < 0 for v in scan.invars[:mc] if v in outer):
    return None  # the inner consts read the carry or xs: not a plain nesting
  prefix = _compat.sub_function(kept, reads, made_consts)
  step = jex_core.jaxpr_as_fun(scan.params["jaxpr"])

  def flat_scan(*args):
    made = dict(zip(made_consts, prefix(*(args[outer[v]] for v in reads))))
    consts = [made[v] if v in made else args[outer[v]] for v in scan.invars[:mc]]
    rows = [args[i].reshape(n1 * n2, *args[i].shape[2:]) for i in xs]

    def one(c, x):
      return list(step(*consts, *c, *x)), None
    return jax.lax.scan(one, list(args[nc:nc + ncarry]), rows, unroll=scan.params["unroll"])[0]

  avals = [jax.ShapeDtypeStruct(a.shape, a.dtype) for a in map(_compat.array_aval, eqn.invars)]
  made_jaxpr = jax.make_jaxpr(flat_scan)(*avals).jaxpr
  if made_jaxpr.constvars or any(isinstance(v, _compat.Literal) for v in made_jaxpr.outvars):
    return None
  return _compat.spliced(made_jaxpr, eqn.invars, eqn.outvars, source_info=eqn.source_info)
