"""Scans: profile one iteration, choose a segment length, emit a nested scan.

A stack of identical layers written with ``jax.lax.scan`` or Flax's ``nn.scan`` (the
activation as the carry, the per-layer parameters stacked along a leading axis as
``xs``) traces to a single ``scan`` equation, which the chain tracer sees as one layer;
so does a recurrent net over time (``nn.RNN``: the state as the carry, the input's time
steps as ``xs``, the cell's parameters as consts). Each is treated as a uniform chain
of ``length`` iterations: the carry is ``a``, the residuals of one iteration's VJP are
``b``. A segment length ``k`` is chosen under model R, and the scan is replaced by an
outer scan over ``n // k`` segments whose body is a ``jax.checkpoint`` of an inner scan
over ``k`` iterations (segment ``j`` reads rows ``jk..jk+k-1`` of the stacked ``xs``),
followed by one shorter checkpointed segment of the last ``n mod k`` rows where ``k``
does not divide ``n`` (for an RNN, the last segment padded); or, for one block a segment
(``BLOCK``), by the scan of the checkpointed block. The forward keeps ``ceil(n / k)``
carries; the backward recomputes one segment at a time. ``k`` divides ``n`` for a stack;
an RNN's may not (its lengths are the data's: 127 tokens after a language model's shift).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import cast

import jax
import jax.numpy as jnp
from jax.extend import core as jex_core

from jaxremat._errors import UnsupportedScanError
from jaxremat._jaxpr import compat as _compat
from jaxremat._jaxpr.emit import jax_policy
from jaxremat._jaxpr.layer_vjp import flops as layer_flops
from jaxremat._jaxpr.remat_scan import flattened as _flattened
from jaxremat._jaxpr.residuals import residuals
from jaxremat._jaxpr.trace import Layer, TracedChain
from jaxremat._model.chain import Chain, Plan, peak_bytes


#: A stack's ``segment`` in ``rewrite`` for one block a segment written as the scan of the
#: checkpointed block (``nn.scan(nn.remat(block))``), without an inner scan of one: XLA
#: keeps less of one form or the other depending on the model (a user's scanned encoder
#: 36.67 MiB against 38.38 with the inner scan; the realworld scanned LM 37.18 against
#: 35.18), so ``apply`` compiles both where it measures segment lengths.
BLOCK = 0


@dataclasses.dataclass(frozen=True)
class ScanPlan:
  """How one scanned layer stack runs.

  Attributes:
    layer: index (0-based) of the chain layer that holds the scan.
    name: that layer's name.
    length: iterations ``n`` of the scan.
    segment: iterations ``k`` per checkpointed segment; ``k == n``: left as it was.
    chain: the uniform chain of one iteration repeated ``n`` times (bytes, FLOPs).
    optimal_peak_bytes: model R's least peak over all plans of ``chain`` (bytes), for
      comparison with the uniform segmentation's ``peak_bytes`` (a lower bound).
    block: with ``segment == 1``, each segment is the checkpointed block itself, not an
      inner scan of one (``BLOCK``).
    recurrent: the scan steps over inputs computed from the batch (an RNN over time, its
      carry the state), not over stacked parameters (a stack of layers).
  """

  layer: int
  name: str
  length: int
  segment: int
  chain: Chain
  optimal_peak_bytes: int
  block: bool = False
  recurrent: bool = False

  @property
  def choice(self) -> int:
    """How the stack is segmented, as one int: ``segment``, or ``BLOCK`` (0) for one
    block a segment written as the checkpointed block itself."""
    return BLOCK if self.block else self.segment

  @property
  def peak_bytes(self) -> int:
    """Model R's peak of the stack under checkpoints every ``segment`` (bytes), an RNN's
    padded last segment counted whole."""
    return peak_bytes(*_as_run(self.chain, self.segment, self.recurrent))

  @property
  def rematerialised(self) -> bool:
    return self.segment < self.length


def rewrite(traced: TracedChain, segment: int | str | Sequence[int],
            policies: Sequence[str | None] | None = None
            ) -> tuple[TracedChain, tuple[ScanPlan, ...]]:
  """Finds the scanned layer stacks of ``traced`` and segments them.

  Args:
    traced: the traced model.
    segment: ``"auto"`` (each stack's ``k`` by ``choose_segment``), an int (the same
      ``k`` for every stack), or one ``k`` per stack in order (to replay a choice; there
      ``BLOCK``: one block a segment without an inner scan).
    policies: per stack in order, what its segments' ``jax.checkpoint`` keeps: ``None``
      (nothing) or a policy option (``DOTS``, ``DOTS_NO_BATCH``: the outputs of its
      matrix products, in every iteration).

  Returns:
    The traced model with each segmented scan replaced, and a ``ScanPlan`` per stack.

  Raises:
    UnsupportedScanError: a scan over stacked parameters whose carry is not the
      activation, an int ``segment`` longer than a stack, or an int ``segment`` for a
      model without a scan to segment.
  """
  single = isinstance(segment, int) and not isinstance(segment, bool)
  if not (segment == "auto" or (single and isinstance(segment, int) and segment >= 1)
          or isinstance(segment, (list, tuple))):
    raise UnsupportedScanError(
        f"scan_segment must be 'auto', a segment length >= 1 or None, got {segment!r}.")
  traced = _flattened(traced)
  found = _find(traced)
  if single and not found:
    raise UnsupportedScanError(
        f"scan_segment={segment} asks to segment a scan, but the model has none at its "
        "top level (a jax.lax.scan / nn.scan / nn.RNN of two or more steps whose carry or "
        "xs come from the batch).")
  if isinstance(segment, (list, tuple)) and len(segment) != len(found):
    every = _find(traced, shortest=1)  # a replay at a length of one step: not segmented
    if len(every) == len(segment):
      segment = [k for k, at in zip(segment, every) if at in found]
  if isinstance(segment, (list, tuple)) and len(segment) != len(found):
    raise UnsupportedScanError(
        f"{len(segment)} segment lengths given for {len(found)} scanned stacks.")
  layers = list(traced.layers)
  plans = []
  for j, (li, ei, recurrent) in enumerate(found):
    layer = layers[li]
    eqn = layer.eqns[ei]
    name = _scan_name(layer.name, eqn)
    chain = iteration_chain(eqn, name)
    n = eqn.params["length"]
    block = False
    if segment == "auto":
      k = choose_segment(chain, any_length=recurrent)
    else:
      k = int(segment[j] if isinstance(segment, (list, tuple)) else cast(int, segment))
      if k == BLOCK and not single:
        k, block = 1, True
      if not single:  # a replay's k, planned for another length: at most this one
        k = min(k, n)
      if k > n:
        raise UnsupportedScanError(
            f"segment length {k} is longer than the {n} iterations of the scan in layer "
            f"{layer.name!r}; use a length from 1 to {n} ({n}: no checkpoint inside it).")
    optimal = peak_bytes(chain, _optimal(chain))
    policy = policies[j] if policies else None
    plans.append(ScanPlan(li, name, n, k, chain, optimal, block, recurrent))
    if k < n or policy:
      eqns = list(layer.eqns)
      eqns[ei] = nested_scan_eqn(eqn, k, policy, block, padded=recurrent)
      layers[li] = dataclasses.replace(layer, eqns=tuple(eqns))
  return dataclasses.replace(traced, layers=tuple(layers)), tuple(plans)


def _scan_name(layer: str, eqn: _compat.JaxprEqn) -> str:
  """The layer's name, followed by the modules below it that run the scan, if any
  (``bi_0/RNN_1``: the backward RNN of an ``nn.Bidirectional`` layer)."""
  path = _compat.module_path(eqn)
  last = layer.split("/")[-1]
  below = path[path.index(last) + 1:] if last in path else ()
  return "/".join((layer, *below))


def _find(traced: TracedChain, shortest: int = 2) -> list[tuple[int, int, bool]]:
  """(layer, equation) indices of the scans to segment, in order, each with whether it
  is recurrent (its xs computed from the batch): the forward or reverse scans of
  ``shortest`` iterations or more whose xs or carry depend on the batch."""
  varying = set(traced.batch_vars)

  def batch_read(eqn) -> list[bool]:  # per input, whether it depends on the batch
    dep = [not isinstance(v, _compat.Literal) and v in varying for v in eqn.invars]
    if any(dep):
      varying.update(eqn.outvars)
    return dep
  for eqn in traced.prelude:  # values of the batch alone moved before the layers
    batch_read(eqn)
  found = []
  for li, layer in enumerate(traced.layers):
    for ei, eqn in enumerate(layer.eqns):
      dep = batch_read(eqn)
      if eqn.primitive.name != "scan":
        continue
      nc, ncarry = eqn.params["num_consts"], eqn.params["num_carry"]
      carry_dep, xs_dep = dep[nc:nc + ncarry], dep[nc + ncarry:]
      if not xs_dep or not any(dep):
        continue  # a loop with no stacked inputs, or on parameters only
      if not any(xs_dep) and not any(carry_dep):
        where = f"the scan in layer {li + 1} {layer.name!r} (length {eqn.params['length']})"
        raise UnsupportedScanError(
            f"{where} scans over stacked parameters but its carry does not depend on the "
            "batch: the activation does not flow through the carry, so it is not a chain "
            "of layers. Make the activation the carry (x, _ = scan(block, x, params)) or "
            "pass scan_segment=None to leave the scan as it is.")
      if eqn.params["length"] >= shortest:  # a stack of layers, or steps over the batch's time
        found.append((li, ei, any(xs_dep)))
  return found


def iteration_chain(eqn: _compat.JaxprEqn, name: str = "scan") -> Chain:
  """The uniform chain of ``eqn`` (a scan): one iteration's bytes repeated ``length`` times.

  ``a`` is the carry (bytes), ``b`` the residuals one iteration's VJP saves, each a
  stacked loop output XLA cannot fuse away (stacked parameter slices excluded: they
  are inputs; those of the consts alone are hoisted out of the loop), ``e`` the part of
  ``b`` that is the iteration's own input carry, ``f`` its FLOPs.
  """
  body = eqn.params["jaxpr"]
  if body.consts:
    raise UnsupportedScanError("a scan body with closed-over constants is not supported.")
  jaxpr = body.jaxpr
  nc, ncarry, n = eqn.params["num_consts"], eqn.params["num_carry"], eqn.params["length"]
  carry_in = tuple(jaxpr.invars[nc:nc + ncarry])
  invariants = (*jaxpr.invars[:nc], *jaxpr.invars[nc + ncarry:])
  outs = tuple(v for v in jaxpr.outvars if not isinstance(v, _compat.Literal))
  layer = Layer(name, tuple(jaxpr.eqns), carry_in, invariants, outs[:ncarry], outs[ncarry:])
  grads = {v for v in invariants if _compat.is_float(v.aval)}
  res = residuals(layer, carry_in, grads, differentiate_inputs=True,  # unfused: stacked outputs
                  loop_invariant=jaxpr.invars[:nc])
  act = sum(_compat.aval_bytes(v.aval) for v in carry_in)
  cot = sum(_compat.aval_bytes(v.aval) for v in carry_in if _compat.is_float(v.aval))
  flops = layer_flops(layer, carry_in)
  return Chain([act] * (n + 1), [res.total] * n, cot_bytes=[cot] * (n + 1),
               input_res_bytes=[res.own_input] * n, flops=[flops] * n,
               names=[f"{name}[{i}]" for i in range(n)])


def choose_segment(chain: Chain, any_length: bool = False) -> int:
  """The segment length ``k`` of least estimated peak, of the divisors of ``n`` or with
  ``any_length`` of ``segment_lengths(n)``; ``n``: no remat. The estimate is model R's
  peak of checkpoints every ``k`` plus, for ``k < n``, one more copy of a segment's
  residuals: XLA on CPU keeps the stacked residuals of the recomputed inner scan in the
  recompute loop's buffers and again in the backward loop's (calibrated on the MLP and
  transformer stacks of tests/test_scan.py; model R alone favours too long segments).
  Ties go to the longer segment. An RNN's ``k`` that does not divide ``n`` is costed as
  run, its last segment padded to ``k`` steps, and
  chosen only where no divisor of ``n`` lies within a factor of two of it: padding
  wastes steps, and the estimate's small differences between nearby lengths are not
  XLA's (``bench/unseen.py --set recurrent``'s LSTM LM at 128 steps: its 3 led the
  measured sweep to 54.16 MiB, the divisor 4 to 53.16).
  """
  n = chain.n

  def cost(k):
    return peak_bytes(*_as_run(chain, k)) + (k * chain.res_bytes[0] if k < n else 0)

  divisor = min(divisors(n), key=lambda k: (cost(k), -k))
  if not any_length:
    return divisor
  best = min(segment_lengths(n), key=lambda k: (cost(k), -k))
  return divisor if best <= 2 * divisor and divisor <= 2 * best else best


def _as_run(chain: Chain, k: int, padded: bool = True) -> tuple[Chain, Plan]:
  """The uniform ``chain`` as it runs in segments of ``k``, and their checkpoints: where
  ``k`` does not divide its length, ``padded`` (an RNN's) one iteration repeated to whole
  segments, else a shorter last segment (a stack's)."""
  n = -(-chain.n // k) * k if padded else chain.n
  if n > chain.n:
    chain = Chain([chain.act_bytes[0]] * (n + 1), [chain.res_bytes[0]] * n,
                  cot_bytes=[chain.cot_bytes[0]] * (n + 1),
                  input_res_bytes=[chain.input_res_bytes[0]] * n, flops=[chain.flops[0]] * n)
  return chain, _every(n, k)


def _every(n: int, k: int) -> Plan:
  return Plan(tuple(range(k, n, k)))


def layout(scans: Sequence[ScanPlan], policies: dict[int, str]
           ) -> tuple[tuple[int, ...], tuple[str | None, ...]]:
  """``rewrite``'s segments and policies for ``scans`` as planned, except that the stacks
  of the layers in ``policies`` (layer index: policy option) run one iteration per
  segment under that policy (as a ``remat`` of the block with the policy inside a scan)."""
  return (tuple(1 if s.layer in policies else s.choice for s in scans),
          tuple(policies.get(s.layer) for s in scans))


def divisors(n: int) -> list[int]:
  """The divisors of ``n``, ascending: the segment lengths without a shorter last one."""
  return [k for k in range(1, n + 1) if n % k == 0]


def sweep_lengths(n: int, estimate: int, recurrent: bool = False) -> list[int]:
  """The segment lengths compiled to measure a scan of ``n``, ascending: the divisors of
  ``n`` and the estimate's ``estimate``; for an RNN (``recurrent``) also the powers of two
  below ``n`` (a prime length has no divisor but 1)."""
  powers = {2 ** i for i in range(n.bit_length())} if recurrent else set()
  return sorted({*divisors(n), *powers, estimate})


def segment_lengths(n: int) -> list[int]:
  """The segment lengths worth comparing for an RNN of ``n`` steps, ascending: for each
  number of segments ``m``, the shortest ``k`` that makes ``m`` (``ceil(n / m)``; a
  longer one keeps as many carries and recomputes more at once)."""
  return sorted({-(-n // m) for m in range(1, n + 1)})


def _optimal(chain: Chain) -> Plan:
  from jaxremat.solvers import solve  # the solvers import _chain only

  return solve(chain, "optimal")


def nested_scan_eqn(eqn: _compat.JaxprEqn, k: int, policy: str | None = None,
                    block: bool = False, padded: bool = False) -> _compat.JaxprEqn:
  """An equation computing what ``eqn`` (a scan of length ``n``, forward or reverse)
  computes, as an outer scan over ``n / k`` segments, each a ``jax.checkpoint`` of a scan
  over ``k`` (keeping what ``policy``, a policy option, keeps; by default nothing); with
  ``block`` (``k == 1``), the scan of the checkpointed block. A reverse scan's segments
  run last to first, each from its last row. Where ``k`` does not divide ``n`` (a prime
  length, or a plan replayed for another sequence length), the last ``n mod k`` rows are
  one shorter segment; with ``padded`` (an RNN over time), the xs are padded to whole
  segments instead, each padded step leaving the carry as it was, and its outputs cut
  away. Measured on CPU, each form where the other copies: the tail's outputs are
  concatenated (an LSTM LM of 127 steps at ``k = 8``: 47.89 MiB, padded 37.02), the
  padding copies the xs, for a stack its parameters (seven MLP blocks at ``k = 2``:
  61.04 MiB, padded 82.58).

  The checkpoints run in a loop's body, where XLA cannot merge the recompute into the
  forward: they go without ``prevent_cse``'s barriers, which ``jax.checkpoint``'s
  documentation says a scan does not need (XLA:CPU then kept 0.5 MiB less of a user's
  8-block encoder and of the realworld scanned LM, at one block a segment).
  """
  params = eqn.params
  body = jex_core.jaxpr_as_fun(params["jaxpr"])
  nc, ncarry, n = params["num_consts"], params["num_carry"], params["length"]
  reverse = params["reverse"]
  whole, rest = divmod(n, k)
  pad = (k - rest) * (rest > 0 and padded)
  remat_policy = jax_policy(policy) if policy else None

  def nested(*args):
    consts, carry, xs = args[:nc], list(args[nc:nc + ncarry]), list(args[nc + ncarry:])

    def step(c, x):
      out = body(*consts, *c, *x)
      return list(out[:ncarry]), list(out[ncarry:])

    if block:
      carry, ys = jax.lax.scan(jax.checkpoint(step, prevent_cse=False, policy=remat_policy),
                               carry, xs, reverse=reverse, unroll=params["unroll"])
      return [*carry, *ys]

    run, m = step, whole
    if pad:  # the padded rows repeat the row next to them; their steps keep the carry
      xs = [jnp.concatenate([x[:1]] * pad + [x] if reverse else [x] + [x[-1:]] * pad)
            for x in xs]
      xs.append(jnp.arange(n + pad) >= pad if reverse else jnp.arange(n + pad) < n)
      m += 1

      def run(c, x):
        new, y = step(c, x[:-1])
        return [jnp.where(x[-1], a, b) for a, b in zip(new, c)], y

    def segment(c, j):
      xk = [jax.lax.dynamic_slice_in_dim(x, j * k, k) for x in xs]
      return jax.lax.scan(run, c, xk, reverse=reverse, unroll=params["unroll"])

    def segments(c):
      # The stacked xs enter each segment whole and are sliced inside it: as a loop
      # invariant the outer scan keeps them once, not as a per-segment residual copy.
      checkpointed = jax.checkpoint(segment, prevent_cse=False, policy=remat_policy)
      c, ys = jax.lax.scan(checkpointed, c, jnp.arange(m), reverse=reverse)
      ys = [y.reshape(m * k, *y.shape[2:]) for y in ys]
      return c, [y[pad:] if reverse else y[:n] for y in ys] if pad else ys

    def tail(c):  # unpadded: the last n mod k rows, one shorter segment
      last = jax.checkpoint(lambda c, xr: jax.lax.scan(step, c, xr, reverse=reverse,
                                                       unroll=params["unroll"]),
                            prevent_cse=False, policy=remat_policy)
      return last(c, [x[whole * k:] for x in xs])

    parts = [segments] * (m > 0) + [tail] * (rest > 0 and not pad)
    outs = []
    for part in reversed(parts) if reverse else parts:
      carry, ys = part(carry)
      outs.append(ys)
    if reverse:
      outs.reverse()
    ys = outs[0] if len(outs) == 1 else [jnp.concatenate(y) for y in zip(*outs)]
    return [*carry, *ys]

  avals = [jax.ShapeDtypeStruct(a.shape, a.dtype) for a in map(_compat.array_aval, eqn.invars)]
  closed = jax.make_jaxpr(jax.jit(nested, keep_unused=True))(*avals)
  inner = closed.jaxpr
  if (len(inner.eqns) != 1 or inner.constvars or list(inner.eqns[0].invars) != list(inner.invars)
      or list(inner.eqns[0].outvars) != list(inner.outvars)):
    raise UnsupportedScanError("could not express the segmented scan as one call equation.")
  return inner.eqns[0].replace(invars=list(eqn.invars), outvars=list(eqn.outvars),
                               source_info=eqn.source_info)
