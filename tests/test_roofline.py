"""The roofline's arithmetic and its measurement of the local device (no compile)."""

import pytest

from jaxremat._backends.roofline import LEAST_RUN_SECONDS, Roofline, measured_rate


def test_roofline_is_the_larger_of_compute_and_memory_time():
  r = Roofline("x", flops_per_second=1e12, bytes_per_second=1e11, host_bytes_per_second=1e10,
               host_overlap=0.25)
  assert r.seconds(2e12, 1e10) == pytest.approx(2.0)
  assert r.seconds(1e9, 5e11) == pytest.approx(5.0)
  assert r.offload_seconds(1e10) == pytest.approx(2 * 1.0 * 0.75)
  assert Roofline("cpu", 1.0, 1.0).offload_seconds(1) == float("inf")


def _device(rate: float, per_call: float):
  """A device doing ``rate`` work per second after a fixed ``per_call`` cost (seconds),
  and the sizes it was asked to run."""
  asked: list[int] = []

  def run_seconds(n: int) -> float:
    asked.append(n)
    return per_call + n**3 / rate

  return run_seconds, asked


def test_a_fast_device_s_rate_is_measured_past_its_per_call_cost():
  """A GPU's 1024^3 product takes microseconds, less than its launch: timed alone it
  gave an H200 14 TFLOP/s (bench/results/policies-h200/second-pass/env.txt)."""
  rate, per_call = 400e12, 150e-6
  run_seconds, asked = _device(rate, per_call)
  measured = measured_rate(run_seconds, lambda n: float(n**3), 1024, 8192)
  assert measured == pytest.approx(rate, rel=1e-9)  # the per-call cost cancels
  assert asked == [1024, 2048, 4096, 8192]


def test_a_slow_device_is_measured_once_at_the_first_size():
  rate = 50e9  # a CPU: the first size already outlasts LEAST_RUN_SECONDS
  run_seconds, asked = _device(rate, 10e-6)
  assert run_seconds(1024) >= LEAST_RUN_SECONDS
  asked.clear()
  measured = measured_rate(run_seconds, lambda n: float(n**3), 1024, 8192)
  assert asked == [1024]
  assert measured == pytest.approx(1024**3 / (10e-6 + 1024**3 / rate))


def test_where_doubling_adds_no_time_the_rate_is_the_largest_run_s_lower_bound():
  """At the largest size the call's cost still dominates (or the larger run timed no
  slower, noise): the difference would divide by almost nothing, so the work over the
  largest run's time is kept, which the true rate is at least."""
  run_seconds, asked = _device(1e18, 1e-5)
  measured = measured_rate(run_seconds, lambda n: float(n**3), 1024, 4096)
  assert max(asked) == 4096
  assert measured == pytest.approx(4096**3 / run_seconds(4096))
  times = iter([1e-4, 0.9e-4, 0.95e-4])  # no slower at twice and four times the work
  assert measured_rate(lambda n: next(times), float, 1, 4) == pytest.approx(4 / 0.95e-4)


def test_a_steps_spread_is_its_median_time_over_its_least():
  from jaxremat._backends.step_time import spread
  assert spread([0.2, 0.1, 0.15]) == pytest.approx(0.5)  # median 0.15 over least 0.1
  assert spread([0.1, 0.3, 0.3, 0.1]) == pytest.approx(2.0)  # upper median of an even count
  assert spread([0.25]) == 0.0


def test_steps_within_the_fastest_ones_noise_go_to_the_least_footprint():
  from jaxremat._backends.step_time import ranked
  fast = [0.100, 0.104, 0.110]  # least 0.100, median 0.104
  near = [0.101, 0.105, 0.108]  # its least within the fastest's median and TIE: a tie
  slow = [0.120, 0.121, 0.125]
  assert ranked([fast, near, slow], [30, 20, 10]) == [1, 0, 2]  # the tie's smaller footprint
  assert ranked([fast, near, slow], [10, 20, 5]) == [0, 1, 2]  # the slow one is no tie
  assert ranked([near, fast], [20, 20]) == [1, 0]  # equal footprints: the faster
  assert ranked([[0.2]], [1]) == [0]
  noisy = [0.100, 0.150, 0.160]  # a median far above its least: the tie stops at TIE
  assert ranked([noisy, [0.101, 0.2], [0.110, 0.2]], [30, 20, 10]) == [1, 0, 2]
