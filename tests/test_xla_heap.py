"""XLA's temp allocation replayed from its own values (``_backends/heap.py``): hand-traced
cases of the heap's rules, and the replay against the temp bytes XLA itself allocates."""

import functools
import lzma
import pathlib
import sys

import flax.linen as nn
import jax
import jax.numpy as jnp
import pytest

import jaxremat
from jaxremat import zoo
from jaxremat._api.loss import training_loss
from jaxremat._backends.heap import TempValue, live_peak_bytes, replay_temp_bytes

# bench/ is not installed: import it from the repository root (appended, so an installed
# jaxremat still comes first).
sys.path.append(str(pathlib.Path(__file__).resolve().parent.parent))
from bench.xla_heap import measure_with_temp_values, read_temp_values  # noqa: E402

pytestmark = pytest.mark.xla  # compiles with XLA: the slow set

cpu_only = pytest.mark.skipif(jax.default_backend() != "cpu", reason="XLA's CPU dumps")

U = 64  # bytes: one aligned unit


def test_a_value_ending_where_another_starts_overlaps_it():
  a = TempValue(id=1, first=0, last=1, offset=0, size=2 * U)
  b = TempValue(id=2, first=1, last=2, offset=2 * U, size=2 * U)
  assert live_peak_bytes([a, b]) == 4 * U
  assert replay_temp_bytes([a, b]) == 4 * U


def test_a_value_written_in_place_over_its_operand_is_one_buffer():
  a = TempValue(id=1, first=0, last=1, offset=0, size=2 * U)
  b = TempValue(id=2, first=1, last=2, offset=0, size=2 * U)  # same offset: in place
  c = TempValue(id=3, first=2, last=3, offset=2 * U, size=U)
  assert live_peak_bytes([a, b, c]) == 3 * U
  assert replay_temp_bytes([a, b, c]) == 3 * U


def test_values_live_apart_reuse_bytes_and_sizes_are_aligned():
  a = TempValue(id=1, first=0, last=0, offset=0, size=100)
  b = TempValue(id=2, first=0, last=1, offset=128, size=10)
  c = TempValue(id=3, first=2, last=2, offset=0, size=50)
  # a (100 B) and b overlap: b starts at a's aligned end, 128; c reuses a's bytes.
  assert replay_temp_bytes([a, b, c]) == 138


def test_the_best_fit_heap_leaves_a_hole_the_live_bytes_do_not_show():
  # Units of 64 B. Traced by hand: events (alloc 2, alloc 1, free 1, alloc 4, free 2,
  # alloc 3, free 4, free 3) give ticks v2 [0, 4], v1 [1, 2], v4 [3, 6], v3 [5, 7].
  # Largest first (ties: longer first): v3 at 0, v1 at 0, v2 above v1 at 3, v4 above v3
  # and v2 at 5: 7 units. Longest first: v2 at 0, v4 at 2, v3 at 4 (the gap under v4
  # is 2 < 3), v1 at 2: 7 units. Live bytes peak at 5 units (steps 1 and 3).
  values = [TempValue(id=1, first=1, last=1, offset=0, size=3 * U),
            TempValue(id=2, first=0, last=2, offset=3 * U, size=2 * U),
            TempValue(id=3, first=3, last=5, offset=0, size=3 * U),
            TempValue(id=4, first=2, last=3, offset=5 * U, size=2 * U)]
  assert live_peak_bytes(values) == 5 * U
  assert replay_temp_bytes(values) == 7 * U


def test_tuple_pointer_tables_are_appended_above_the_heap_smallest_first():
  heap = TempValue(id=1, first=0, last=3, offset=0, size=2 * U)
  tables = [TempValue(id=7, first=1, last=1, offset=0, size=136, is_tuple=True),
            TempValue(id=8, first=2, last=2, offset=0, size=16, is_tuple=True)]
  # 128, then the 16-byte table (to 144), then the 136-byte one at the aligned 192.
  assert replay_temp_bytes([heap, *tables]) == 192 + 136


def _step_values(model, x, checkpoints, **kwargs):
  params = model.init(jax.random.key(0), x)
  fn = jaxremat.apply(model.apply, params, x, plan=jaxremat.Plan(checkpoints), verify=False,
                      **kwargs).fn
  return measure_with_temp_values(training_loss(fn, kwargs), params, x)


pool = functools.partial(nn.max_pool, window_shape=(2, 2), strides=(2, 2))


@cpu_only
@pytest.mark.parametrize("name, build, shape, checkpoints", [
    # the zoo's ViT of bench/memory.py, every block rematerialised: XLA's heap leaves a
    # hole there (docs/memory-model.md)
    ("vit", lambda: zoo.vit(patch=4, dim=64, depth=6, num_heads=4), (16, 32, 32, 3),
     (1, 2, 3, 4, 5, 6, 7)),
    ("pooled cnn", lambda: nn.Sequential([nn.Conv(8, (3, 3)), nn.relu, pool,
                                          nn.Conv(16, (3, 3)), nn.relu, pool,
                                          lambda x: x.reshape(x.shape[0], -1), nn.Dense(10)]),
     (8, 16, 16, 3), (2, 4)),
    ("mlp", lambda: zoo.mlp([256, 64, 512, 32, 10]), (32, 128), ()),
])
def test_the_replay_is_xlas_temp_allocation_to_the_byte(name, build, shape, checkpoints):
  footprint, values = _step_values(build(), jnp.ones(shape), checkpoints)
  assert values, name
  replayed = replay_temp_bytes(values)
  assert replayed == footprint.temp_bytes, name
  assert live_peak_bytes(values) <= replayed, name


@cpu_only
def test_the_values_of_a_loop_and_a_conditional_are_read():
  # XLA marks a while loop's and a conditional's outputs "(phi)" in its dump; before they
  # were read, this step's replay came out 17% short of XLA's temp allocation; now it is
  # 768 bytes (0.1%) over it, a difference not yet explained: within 1%, not to the byte.
  def loss(stack, x):
    h, _ = jax.lax.scan(lambda h, w: (jnp.tanh(h @ w), None), x, stack)
    h = jax.lax.cond(h.sum() > 0, jnp.sin, lambda h: 2 * jnp.cos(h), h)
    return (h ** 2).sum()

  footprint, values = measure_with_temp_values(loss, jnp.ones((6, 128, 128)),
                                               jnp.ones((64, 128)))
  replayed = replay_temp_bytes(values)
  assert abs(replayed - footprint.temp_bytes) <= 0.01 * footprint.temp_bytes
  assert live_peak_bytes(values) <= replayed


#: Two steps' buffer-assignment and live-range dumps from the second H100 run of
#: 2026-11-23 (jax 0.11.2), xz-compressed; tests/data/README.md says where they come from.
_H100_DUMPS = pathlib.Path(__file__).resolve().parent / "data" / "h100"


@pytest.mark.parametrize("step", ["mlp-uneven-b4096-optimal", "vgg16-b512-32px-optimal"])
def test_the_replay_is_xlas_temp_allocation_in_recorded_h100_dumps(step, tmp_path):
  # The MLP's plan is one where the H100's heap leaves 32 MiB (5.6%) between buffers.
  paths = []
  for kind in ("buffer-assignment", "live-range"):
    path = tmp_path / f"{kind}.txt"
    path.write_bytes(lzma.decompress((_H100_DUMPS / f"{step}-{kind}.txt.xz").read_bytes()))
    paths.append(str(path))
  temp, values = read_temp_values(*paths)
  assert temp > 0 and values
  assert replay_temp_bytes(values, alignment=256) == temp
  assert live_peak_bytes(values) <= temp
