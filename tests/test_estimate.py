"""The estimate's buffer assignment: XLA's rule for placing buffers in gradient buffers."""

import dataclasses

import jax
import jax.numpy as jnp
import pytest

import jaxremat
from jaxremat import zoo
from jaxremat._model.chain import Chain, Plan
from jaxremat._backends.estimate import _hosted, estimate_temp_bytes
from jaxremat._backends.profile import Buffers
from jaxremat._backends.buffers import CpuBuffers, StartBuffers
from jaxremat.solvers import uniform_plan

pytestmark = pytest.mark.xla  # compiles with XLA: the slow set

cpu_only = pytest.mark.skipif(jax.default_backend() != "cpu", reason="CPU buffer assignment")


def test_a_buffer_keeps_one_gradient_buffer_for_its_whole_life():
  """One gradient buffer G = 100, written at step 5. A (90) is live at steps 0-2, B (100)
  at step 2, D (110, larger than G) at step 0. Worked by hand from XLA's BufferAssigner:
  B, the largest that fits, takes G; A overlaps B, so it is temp for all its life, and
  step 0 holds A + D = 200. (Placing anew at each step would give 110.)"""
  steps = [[(90, "A"), (110, "D")], [(90, "A")], [(90, "A"), (100, "B")]]
  assert _hosted(steps, [(100, 5, 1)]) == 200
  # Without B, A takes G for steps 0-2; D is then alone in temp.
  assert _hosted([[(90, "A"), (110, "D")], [(90, "A")], [(90, "A")]], [(100, 5, 1)]) == 110


def test_a_gradient_buffer_hosts_nothing_at_or_after_its_write():
  """G is written at step 2: A, live at steps 0-2, cannot use it; C (live 0-1) can."""
  assert _hosted([[(90, "A")], [(90, "A")], [(90, "A")]], [(100, 2, 1)]) == 90
  assert _hosted([[(90, "A"), (60, "C")], [(90, "A"), (60, "C")], [(90, "A")]], [(100, 2, 1)]) == 90
  # Each buffer goes to the smallest gradient buffer it fits: A to H (95), C to G.
  assert _hosted([[(90, "A"), (60, "C")], [(90, "A"), (60, "C")]], [(100, 9, 1), (95, 9, 2)]) == 0


def test_a_saved_output_is_counted_once_as_a_residual():
  """Layer 2 (elementwise, a ReLU) saves its output x_2 (20) as its residual, which layer 3
  reads as its input. No remat, no gradients to host. Forward at layer 3: residuals of
  layers 1-3 (100 + 20 + 100) + x_3 (30) = 250; x_2 is that residual, not a second
  buffer (270 if it were). Forward at layer 2: 100 + 20 (written over x_1) = 120; the
  backward at layer 3: 220 + g_3 + g_2 = 225."""
  chain = Chain(act_bytes=[0, 10, 20, 30], res_bytes=[100, 20, 100], cot_bytes=[0, 1, 2, 3])
  buffers = Buffers(residuals=((100,), (20,), (100,)), inputs=((), (), ()),
                    param_grads=((), (), ()), elementwise=(False, True, False),
                    saves_output=(False, True, False))
  assert estimate_temp_bytes(chain, buffers, Plan(())) == 250


def test_a_recomputed_layers_kernel_copy_lives_from_its_recompute_to_its_backward():
  """Layers 1-2 recomputed; layer 2's backward reads a kernel copy K = 50 that its
  recompute makes when it starts. Steps: forward 1-3, backward 3, recompute 1-2,
  backward 2, backward 1. Without a gradient buffer for K, the backward at layer 2 holds
  residuals of 1-2 (200) + g_2 (62) + g_1 (61) + K = 373. Every other buffer is larger
  than 50, so only K can use a 50-byte gradient buffer."""
  chain = Chain(act_bytes=[0, 60, 70, 80], res_bytes=[100, 100, 100], cot_bytes=[0, 61, 62, 63])

  def buffers(param_grads):
    return Buffers(residuals=((100,), (100,), (100,)), inputs=((), (), ()),
                   param_grads=param_grads,
                   start=(StartBuffers(), StartBuffers(kernels=(50,)), StartBuffers()))

  assert estimate_temp_bytes(chain, buffers(((), (), ())), Plan((2,))) == 373
  # Layer 2's own gradient takes K over where it is written, from K's last reader: 323.
  assert estimate_temp_bytes(chain, buffers(((), (50,), ())), Plan((2,))) == 323
  # Layer 3's gradient is written before the recompute: no room for K.
  assert estimate_temp_bytes(chain, buffers(((), (), (50,))), Plan((2,))) == 373
  # Layer 1's is written after layer 2's backward: K fits there.
  assert estimate_temp_bytes(chain, buffers(((50,), (), ())), Plan((2,))) == 323


def test_a_larger_input_cotangent_is_written_after_the_layers_residuals_are_read():
  """Layer 2 downsamples: g_1 (40) > g_2 (10), written last (``late_cotangent``). It saves
  its input x_1 (40) and residuals of 300, with workspace 100. No remat. Its backward
  first holds layer 1's residual (100) + its own (300) + x_1 + g_2 + w_2 = 550, then,
  its residuals read, 100 + x_1 + g_2 + g_1 + w_2 = 290. One step holding all of it
  (590) over-counts; the forward peaks at layer 2 with 100 + 300 + x_1 + x_2 (10) = 450."""
  chain = Chain(act_bytes=[0, 40, 10, 5], res_bytes=[100, 340, 1], cot_bytes=[0, 40, 10, 5],
                workspace_bytes=[0, 100, 0])
  buffers = Buffers(residuals=((100,), (300,), (1,)), inputs=((), (40,), ()),
                    param_grads=((), (), ()), cpu=CpuBuffers(late_cotangent=(False, True, False)))
  assert estimate_temp_bytes(chain, buffers, Plan(())) == 550
  one_step = dataclasses.replace(buffers, cpu=CpuBuffers(late_cotangent=()))
  assert estimate_temp_bytes(chain, one_step, Plan(())) == 590


@cpu_only
@pytest.mark.parametrize("checkpoints", [(3, 5), (2, 4, 6, 8)])
def test_a_resnet_with_downsampling_blocks_is_estimated_within_3_percent_of_xla(checkpoints):
  """The oracle is XLA's compiled statistics. With each block's input cotangent held
  beside all its residuals, these plans were 7.3% and 4.3% over."""
  model = zoo.resnet_by_name("resnet50", width=0.125, depth=0.34)
  x = jax.random.normal(jax.random.key(1), (4, 32, 32, 3))
  params = jax.jit(model.init)(jax.random.key(0), x)
  kwargs = {"mutable": ["batch_stats"]}
  r = jaxremat.apply(model.apply, params, x, plan=Plan(checkpoints), verify=False, **kwargs)
  # The stride-2 blocks (larger input than output cotangent) write g_{i-1} last.
  downsampling = [r.chain.cot_bytes[i - 1] > r.chain.cot_bytes[i] for i in range(1, r.chain.n + 1)]
  assert r._planner.buffers.cpu.late_cotangent == tuple(downsampling) and any(downsampling)
  measured = jaxremat.measure(lambda p, b: jnp.mean(jnp.square(r.fn(p, b, **kwargs)[0])),
                              params, x).total_bytes
  assert abs(r.predicted_total_bytes / measured - 1) < 0.03, (r.predicted_total_bytes, measured)


def test_the_final_segment_holds_the_operands_its_input_is_recomputed_from():
  """Layer 2 reads x_1 in fusions, so XLA keeps the operands (500) of x_1's elementwise
  tail from layer 1's forward to layer 2's backward. Plan (1,), worked by hand: the
  forward at layer 3 holds x_1 (10) + the residuals of 2..3 (200) + x_2 (20) + x_3 (30)
  = 260, and the operands besides: 760 (the recompute of layer 1, 101, is after)."""
  chain = Chain(act_bytes=[0, 10, 20, 30], res_bytes=[100, 100, 100], cot_bytes=[0, 1, 2, 3])
  plain = Buffers(residuals=((100,), (100,), (100,)), inputs=((), (), ()),
                  param_grads=((), (), ()))
  assert estimate_temp_bytes(chain, plain, Plan((1,))) == 260
  kept = dataclasses.replace(plain, cpu=CpuBuffers(operands=((500,), (), ()),
                                                  operands_read_input=(False, False, False)))
  assert estimate_temp_bytes(chain, kept, Plan((1,))) == 760
  # Plan (2,): the forward at layer 3 holds x_2 + 100 + x_3 = 150, below the recompute
  # of layers 1..2 (their residuals 200 + x_1 + g_2 = 212), until layer 2's operands
  # (500) count: 650. When x_2's tail reads x_1 and 1 is no checkpoint, x_1 is
  # recomputed the same way, from layer 1's operands (700): 1350.
  chained = dataclasses.replace(plain, cpu=CpuBuffers(operands=((700,), (500,), ()),
                                                     operands_read_input=(False, False, False)))
  assert estimate_temp_bytes(chain, plain, Plan((2,))) == 212
  assert estimate_temp_bytes(chain, chained, Plan((2,))) == 650
  chained = dataclasses.replace(chained, cpu=dataclasses.replace(
      chained.cpu, operands_read_input=(False, True, False)))
  assert estimate_temp_bytes(chain, chained, Plan((2,))) == 1350
  assert estimate_temp_bytes(chain, chained, Plan((1, 2))) == 660  # x_1 is held (10)


@cpu_only
def test_a_resnet_whose_final_segment_starts_after_a_projection_block_is_near_xla():
  """The oracle is XLA's compiled statistics. The zoo's ResNet-152 with plan (3, 4, 5, 6):
  block 7 reads x_6 in a convolution and in its residual add, so XLA keeps block 6's two
  convolution outputs to recompute x_6 there; without them the prediction was 4.9% low."""
  model = zoo.resnet_by_name("resnet152", width=0.125, depth=0.15)
  x = jax.random.normal(jax.random.key(1), (8, 32, 32, 3))
  params = jax.jit(model.init)(jax.random.key(0), x)
  kwargs = {"mutable": ["batch_stats"]}
  r = jaxremat.apply(model.apply, params, x, plan=Plan((3, 4, 5, 6)), verify=False,
                     **kwargs)
  cpu = r._planner.buffers.cpu
  assert len(cpu.operands[5]) >= 2 and not cpu.operands_read_input[5]
  measured = jaxremat.measure(lambda p, b: jnp.mean(jnp.square(r.fn(p, b, **kwargs)[0])),
                              params, x).total_bytes
  assert abs(r.predicted_total_bytes / measured - 1) < 0.03, (r.predicted_total_bytes, measured)


@cpu_only
@pytest.mark.parametrize("checkpoint_every", [None, 2])
def test_an_uneven_mlp_is_estimated_within_half_a_percent_of_xla(checkpoint_every):
  """The oracle is XLA's compiled statistics. Buffers placed anew at each step made
  no remat 0.7% low and checkpoints every 2 layers 1.6% high on the benchmark's MLP."""
  model = zoo.mlp((512, 1024, 256, 2048, 128, 512, 10))
  x = jax.random.normal(jax.random.key(1), (256, 300))
  params = model.init(jax.random.key(0), x)
  r = jaxremat.apply(model.apply, params, x)
  plan = jaxremat.Plan(()) if checkpoint_every is None else uniform_plan(r.chain.n, checkpoint_every)
  fn = jaxremat.apply(model.apply, params, x, plan=plan, verify=False).fn
  measured = jaxremat.measure(lambda p, b: jnp.mean(jnp.square(fn(p, b))), params, x).total_bytes
  assert abs(r.predict_total_bytes(plan) / measured - 1) < 0.005
