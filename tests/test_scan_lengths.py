"""Segment lengths of a scanned stack: any k from 1 to n, the shorter last segment included.

The estimate's choice is checked against a brute force over every k with the literal
model-R peak of tests/oracles.py; no compile.
"""

from __future__ import annotations

import pytest

from jaxremat import Chain
from jaxremat._jaxpr import scan as _scan

from oracles import literal_peak_of  # noqa: E402


@pytest.mark.parametrize("n", [1, 2, 7, 12, 31, 64, 127, 128])
def test_segment_lengths_hold_the_shortest_k_of_every_segment_count(n):
  lengths = _scan.segment_lengths(n)
  counts = {}
  for k in range(1, n + 1):  # brute force: the shortest k for each number of segments
    counts.setdefault(-(-n // k), k)
  assert sorted(min(k for k in range(1, n + 1) if -(-n // k) == m) for m in counts) == lengths


@pytest.mark.parametrize("n,act,res", [(127, 4, 12), (128, 4, 12), (31, 1, 1), (31, 1, 20), (12, 3, 5),
                                       (97, 8, 3), (2, 1, 1)])
def test_choose_segment_is_the_least_of_every_k(n, act, res):
  """A stack's k is the least of the divisors under the literal model-R peak plus a
  segment's residual copy (a padded last segment costed whole); an RNN's the least of
  every k of 1..n unless that lies within a factor of two of the divisor's, and a prime
  length is cut."""
  chain = Chain([act] * (n + 1), [res] * n)

  def cost(k):  # a last segment that k does not fill is padded: k steps all the same
    steps = -(-n // k) * k
    padded = Chain([act] * (steps + 1), [res] * steps)
    return literal_peak_of(padded, tuple(range(k, steps, k))) + (k * res if k < n else 0)

  def least(lengths):
    return min(lengths, key=lambda k: (cost(k), -k))

  divisor, best = least(_scan.divisors(n)), least(range(1, n + 1))
  stack = _scan.choose_segment(chain)  # a stack's: the least of the divisors
  assert cost(stack) == cost(divisor) and n % stack == 0
  k = _scan.choose_segment(chain, any_length=True)  # an RNN's: the least of every k,
  if best / 2 <= divisor <= 2 * best:  # but a divisor within a factor of two of it
    assert k == stack, (k, divisor, best)
  else:
    assert cost(k) == cost(best), (k, best)
  if (n, act, res) == (127, 4, 12):  # prime: no divisor but 1 and n, yet cut in between
    assert 1 < k < n and n % k


def test_an_rnn_of_prime_length_sweeps_beyond_its_divisors():
  assert _scan.sweep_lengths(127, 11, recurrent=True) == [1, 2, 4, 8, 11, 16, 32, 64, 127]
  assert _scan.sweep_lengths(12, 4, recurrent=True) == [1, 2, 3, 4, 6, 8, 12]
  assert _scan.sweep_lengths(12, 4) == [1, 2, 3, 4, 6, 12]  # a stack: its divisors


@pytest.mark.parametrize("n,k", [(127, 4), (12, 5), (12, 4), (7, 7)])
def test_a_scan_plans_peak_counts_an_rnns_padded_last_segment_whole(n, k):
  """The report's model-R peak of a segmented loop: an RNN's last segment padded to ``k``
  steps (as it runs), a stack's shorter."""
  act, res = 4, 12
  chain = Chain([act] * (n + 1), [res] * n)
  steps = -(-n // k) * k
  padded = Chain([act] * (steps + 1), [res] * steps)

  def plan(recurrent):
    return _scan.ScanPlan(0, "scan", n, k, chain, 0, recurrent=recurrent)

  assert plan(True).peak_bytes == literal_peak_of(padded, tuple(range(k, steps, k)))
  assert plan(False).peak_bytes == literal_peak_of(chain, tuple(range(k, n, k)))
