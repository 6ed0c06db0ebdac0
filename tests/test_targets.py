"""Compile targets (``_backends.targets``): parsing everywhere; with JAX's CUDA plugin,
deviceless H100 compiles checked against XLA's own statistics.

The plugin tests need ``pip install "jaxremat[cuda12-aot]"`` and, on a machine without a
GPU, ``JAX_PLATFORMS=cpu`` set before JAX starts; they skip with the reason otherwise.
"""

import jax
import jax.numpy as jnp
import jaxlib
import numpy as np
import pytest
import flax.linen as nn
from flax import nnx

import jaxremat
from jaxremat import zoo
from jaxremat._api.checks import default_profile
from jaxremat._api.planning import fmt_bytes
from jaxremat._backends import targets
from jaxremat._errors import InvalidArgumentError, TargetUnavailableError
from jaxremat._jaxpr.trace import trace
from scan_models import ScannedMLP

pytestmark = pytest.mark.xla  # compiles with XLA: the slow set

NO_XLA_REMAT = {"xla_disable_hlo_passes": "rematerialization"}
USER_CONFIG = """
gpu_device_info {
  threads_per_warp: 32
  block_dim_limit_x: 2147483647
  core_count: 132
  fpus_per_core: 128
  clock_rate_ghz: 2.0
  memory_bandwidth: 3000000000000
  device_memory_size: 1234
  cuda_compute_capability { major: 9 minor: 0 }
}
platform_name: "CUDA"
device_description_str: "My GPU"
"""


needs_plugin = pytest.mark.skipif(
    not targets.plugin_installed(),
    reason='needs JAX\'s CUDA plugin: pip install "jaxremat[cuda12-aot]"')


@pytest.mark.parametrize("name, gigabytes", [("h100", 80), ("H100", 80), ("a100", 80),
                                              ("h200", 141)])
def test_builtin_targets(name, gigabytes):
  t = targets.get_target(name)
  assert t.name == name.lower() and t.platform == "cuda"
  assert 'platform_name: "CUDA"' in t.config
  assert gigabytes * 10**9 < t.memory_bytes < gigabytes * 1.1 * 10**9  # the data sheet's
  assert dict(t.compiler_options) == {"xla_gpu_enable_triton_gemm": False}
  assert targets.get_target(t) is t


def test_none_is_the_local_backend():
  assert targets.get_target(None) is None


def test_the_compiled_profile_is_the_default_on_a_gpu_local_or_a_target():
  assert default_profile(targets.get_target("h100"), "cpu") == "compiled"
  assert default_profile(None, "gpu") == "compiled"
  assert default_profile(None, "cpu") == "jaxpr"


def test_the_compiled_profile_is_the_default_for_dropout_on_cpu():
  """XLA:CPU keeps a threefry key's random bits (8 bytes an element) where the estimate
  keeps JAX's mask: on the realworld ViT and lm1b with threefry keys the estimate said
  +5.2% / +4.3%, the compiled profile +0.3% / -0.3%, with the same plans."""
  def traced(rate):
    model = nn.Sequential([nn.Dense(8), nn.Dropout(rate, deterministic=rate == 0), nn.Dense(4)])
    x = jnp.ones((4, 8))
    params = model.init(jax.random.key(0), x)
    return trace(model.apply, params, x, {"rngs": {"dropout": jax.random.key(1)}}, None)

  assert default_profile(None, "cpu", traced(0.1)) == "compiled"
  assert default_profile(None, "cpu", traced(0.0)) == "jaxpr"


def test_user_config_as_text_and_as_file(tmp_path):
  from_text = targets.get_target(USER_CONFIG)
  assert (from_text.name, from_text.memory_bytes, from_text.config) == ("My GPU", 1234, USER_CONFIG)
  path = tmp_path / "mine.txtpb"
  path.write_text(USER_CONFIG)
  assert targets.get_target(str(path)) == from_text


@pytest.mark.parametrize("spec, match", [
    ('platform_name: "ROCM"\ngpu_device_info {}\n', 'platform_name "ROCM"'),
    ("gpu_device_info { core_count: 1 }\n", "no platform_name"),
    # without these XLA's compiler divides by zero and kills the process (a user's trial)
    ('platform_name: "CUDA"\n', "threads_per_warp, block_dim_limit_x, core_count"),
    (USER_CONFIG.replace("major: 9", "major: 0"), "cuda_compute_capability"),
    ("v100", "expected one of h100, h200, a100"),
    ("configs/mine.txtpb", "no such file"),
    (100, "got int"),
])
def test_bad_targets(spec, match):
  with pytest.raises(InvalidArgumentError, match=match):
    targets.get_target(spec)


def test_either_cuda_plugin_serves(monkeypatch):
  monkeypatch.setattr(targets, "PLUGIN_MODULES", {12: ("jaxremat_no_such_plugin.xla",),
                                                  13: ("json", "jax")})
  assert targets.plugin_installed()
  monkeypatch.setattr(targets, "PLUGIN_MODULES", {12: ("jaxremat_no_such_plugin.xla",),
                                                  13: ("json", "jaxremat_no_such_plugin.b")})
  assert not targets.plugin_installed()


def test_missing_plugin_says_what_to_install(monkeypatch):
  monkeypatch.setattr(targets, "PLUGIN_MODULES", {12: ("jaxremat_no_such_plugin.xla",)})
  with pytest.raises(TargetUnavailableError) as info:
    targets.target_device(targets.get_target("h100"))
  message = str(info.value)
  assert 'pip install "jaxremat[cuda12-aot]"' in message
  assert f"pip install --no-deps jax-cuda12-plugin=={jaxlib.__version__}" in message
  assert "JAX_PLATFORMS=cpu" in message
  assert isinstance(info.value, RuntimeError) and isinstance(info.value, jaxremat.JaxrematError)


def test_unregistered_plugin_says_to_set_jax_platforms(monkeypatch):
  def unregistered(platform, config):
    raise NotImplementedError("topology not implemented for cuda")

  monkeypatch.setattr(targets, "_installed", lambda module: True)
  monkeypatch.setattr(targets, "_device", unregistered)
  with pytest.raises(TargetUnavailableError, match=r"JAX_PLATFORMS=cpu .*before JAX starts"):
    targets.target_device(targets.get_target("a100"))


def test_abstract_places_every_leaf_on_the_device():
  device = jax.devices()[0]
  tree = {"w": jnp.ones((3, 4), jnp.bfloat16), "n": np.zeros(2, np.int32), "s": 1.5,
          "spec": jax.ShapeDtypeStruct((5,), jnp.float32)}
  out = targets.abstract(tree, device)
  assert {k: (v.shape, v.dtype) for k, v in out.items()} == {
      "w": ((3, 4), jnp.bfloat16), "n": ((2,), jnp.int32), "s": ((), jnp.float32),
      "spec": ((5,), jnp.float32)}
  assert out["s"].weak_type and not out["w"].weak_type
  assert all(v.sharding == jax.sharding.SingleDeviceSharding(device) for v in out.values())
  with pytest.raises(InvalidArgumentError, match="got str"):
    targets.abstract({"name": "relu"}, device)


@pytest.fixture(scope="module")
def h100():
  """The H100 target, or a skip saying why its compiler is not available here."""
  target = targets.get_target("h100")
  try:
    targets.target_device(target)
  except TargetUnavailableError as e:
    pytest.skip(str(e))
  return target


def _loss(fn):
  return lambda p, x: jnp.mean(jnp.square(fn(p, x)))


@needs_plugin
def test_mlp_grad_step_footprint_is_xlas(h100):
  model = zoo.mlp([256, 512, 10])
  x = jax.ShapeDtypeStruct((64, 128), jnp.float32)
  params = jax.eval_shape(model.init, jax.random.key(0), x)  # nothing is allocated
  step = jax.grad(_loss(model.apply))
  fp = targets.target_footprint(step, (params, x), h100)
  stats = targets.compile_on_target(step, (params, x), h100).memory_analysis()
  assert (fp.argument_bytes, fp.output_bytes, fp.temp_bytes, fp.alias_bytes) == (
      stats.argument_size_in_bytes, stats.output_size_in_bytes, stats.temp_size_in_bytes,
      stats.alias_size_in_bytes)
  assert fp.argument_bytes > 0 and fp.output_bytes > 0 and fp.temp_bytes > 0
  param_bytes = sum(p.size * p.dtype.itemsize for p in jax.tree_util.tree_leaves(params))
  assert fp.argument_bytes == param_bytes + 64 * 128 * 4
  assert fp.output_bytes >= param_bytes  # the gradients
  assert fp.backend == "gpu" and fp.compiler_options["xla_gpu_enable_triton_gemm"] is False
  assert fp.flops > 0


@needs_plugin
def test_builtin_and_user_configs_compile(h100):
  renamed = h100.config.replace('"NVIDIA H100 80GB HBM3"', '"My H100"')
  for spec, kind in (("a100", "NVIDIA A100-SXM4-80GB"), (h100, "NVIDIA H100 80GB HBM3"),
                     (renamed, "My H100")):
    target = targets.get_target(spec)
    assert targets.target_device(target).device_kind == kind
    fp = targets.target_footprint(lambda x: jnp.sin(x) * 2.0, (jnp.ones(1024),), target)
    assert fp.argument_bytes == fp.output_bytes == 4096


@needs_plugin
def test_a_config_xla_cannot_parse_says_where():
  wrong = targets.get_target(USER_CONFIG.replace("core_count: 132", "core_count: 132\n  cores: 1"))
  with pytest.raises(InvalidArgumentError, match='no field named "cores"'):
    targets.target_device(wrong)


def test_roofline_of_a_users_config_comes_from_its_device_facts():
  from jaxremat._backends.roofline import roofline_for
  mine = roofline_for(USER_CONFIG)
  assert mine.flops_per_second == pytest.approx(132 * 128 * 2 * 2.0e9)
  assert mine.bytes_per_second == 3e12 and mine.host_bytes_per_second > 0
  assert roofline_for("h200").bytes_per_second > roofline_for("h100").bytes_per_second
  with pytest.raises(InvalidArgumentError, match="memory_bandwidth"):
    roofline_for(USER_CONFIG.replace("memory_bandwidth", "# memory_bandwidth"))


@needs_plugin
def test_checkpoint_compiles_smaller_on_the_target(h100):
  """16 wide tanh layers of small weights: the activations dominate, so checkpointing 4
  segments of 4 layers (keeping their inputs only) must need less memory than keeping
  every layer's activations."""
  n, width, batch = 16, 256, 4096
  params = [jax.ShapeDtypeStruct((width, width), jnp.float32)] * n

  def segment(ws, x):
    for w in ws:
      x = jnp.tanh(x @ w)
    return x

  def plain(ws, x):
    return jnp.mean(jnp.square(segment(ws, x)))

  def remat(ws, x):
    for k in range(0, n, 4):
      x = jax.checkpoint(segment)(ws[k:k + 4], x)
    return jnp.mean(jnp.square(x))

  x = jax.ShapeDtypeStruct((batch, width), jnp.float32)
  without = targets.target_footprint(jax.grad(plain), (params, x), h100, NO_XLA_REMAT)
  with_remat = targets.target_footprint(jax.grad(remat), (params, x), h100, NO_XLA_REMAT)
  activation = batch * width * 4
  assert without.total_bytes - with_remat.total_bytes >= 6 * activation


@needs_plugin
def test_apply_plans_for_the_target_from_abstract_inputs():
  """apply(target=) profiles for the GPU, confirms its plan with the GPU compiler, and
  that figure is what measure(target=) gives for the plan."""
  model = zoo.mlp([256, 1024, 256, 1024, 10])
  x = jax.ShapeDtypeStruct((512, 64), jnp.float32)
  params = jax.eval_shape(model.init, jax.random.key(0), x)
  r = jaxremat.apply(model.apply, params, x, target="h100")
  assert r.target == "h100" and r.measured_total_bytes
  assert r.profile == "compiled"  # the default for a GPU target: the replayed compile
  loss = lambda p, b: jnp.mean(jnp.square(r.fn(p, b)))  # noqa: E731
  assert r.measured_total_bytes == jaxremat.measure(loss, params, x, target="h100").total_bytes
  plain = jaxremat.measure(lambda p, b: jnp.mean(jnp.square(model.apply(p, b))), params, x,
                           target="h100")
  assert r.measured_total_bytes <= plain.total_bytes
  # The replay places XLA's values as XLA's GPU heap does, gaps included (here 2.1 MB).
  assert r.predict_total_bytes(jaxremat.Plan()) == plain.total_bytes
  # the H100 config declares 85520809984 bytes (79.65 GiB) of device memory
  assert r.device_memory_bytes == 85520809984
  assert (f"the h100's device memory 79.65 GiB, of which JAX's allocator takes 75% by "
          f"default (59.74 GiB; XLA_PYTHON_CLIENT_MEM_FRACTION sets the share): the chosen "
          f"plan's gradient step ({fmt_bytes(r.measured_total_bytes)}) fits, the model as "
          "written") in r.report()
  # a user's trial: the model as written fits, and nothing said remat might not be needed
  assert "it needs no remat and runs faster as written" in r.report()
  assert jaxremat.apply(model.apply, params, x, target="h100", profile="jaxpr",
                        verify=False).profile == "jaxpr"


@needs_plugin
def test_apply_nnx_plans_an_abstract_model_with_state_for_the_target():
  """An nnx model with BatchNorm and Dropout, abstract (nnx.eval_shape): its statistics
  and rng counts are arguments of the GPU compiles, and the confirmed footprint is
  measure(target=)'s of the plan."""
  def build():
    rngs = nnx.Rngs(0, dropout=1)
    return nnx.Sequential(
        nnx.Linear(64, 256, rngs=rngs), nnx.BatchNorm(256, rngs=rngs), nnx.relu,
        nnx.Dropout(0.1, rngs=rngs), nnx.Linear(256, 256, rngs=rngs), nnx.relu,
        nnx.Linear(256, 10, rngs=rngs))
  model = nnx.eval_shape(build)
  x = jax.ShapeDtypeStruct((512, 64), jnp.float32)
  r = jaxremat.apply_nnx(model, x, target="h100")
  assert r.profile == "compiled" and r.measured_total_bytes
  loss = lambda m, b: jnp.mean(jnp.square(r.fn(m, b)))  # noqa: E731
  assert jaxremat.measure(loss, model, x, target="h100").total_bytes == r.measured_total_bytes


@needs_plugin
def test_fit_for_the_target_fits_by_the_gpu_compiler():
  """fit(target=) compiles for the GPU: the footprint it reports is the target's, within
  the budget, and its plan's step compiled again for the target measures the same."""
  model = zoo.mlp([256, 1024, 256, 1024, 10])
  x = jax.ShapeDtypeStruct((512, 64), jnp.float32)
  params = jax.eval_shape(model.init, jax.random.key(0), x)
  plain = jaxremat.measure(lambda p, b: jnp.mean(jnp.square(model.apply(p, b))), params, x,
                           target="h100")
  budget = plain.total_bytes - 1
  fitted = jaxremat.fit(model.apply, params, x, budget, target="h100")
  assert fitted.target == "h100"
  loss = lambda p, b: jnp.mean(jnp.square(fitted.fn(p, b)))  # noqa: E731
  measured = jaxremat.measure(loss, params, x, target="h100").total_bytes
  assert measured <= budget
  assert measured == fitted.measured_total_bytes and measured in fitted.compiled
  # the compiled profile's compile of the plain step gives the no-remat footprint
  assert fitted.no_remat_bytes == plain.total_bytes


@needs_plugin
def test_fit_compiles_every_k_plans_before_it_calls_a_budget_infeasible():
  """VGG-11 at half its activations on the H100: the profile predicts every plan of its
  search and its checkpoint-every-k plans over the budget, while XLA fits some every-k
  plans under it. fit must find one rather than raise InfeasibleBudgetError."""
  from jaxremat import zoo_registry
  from jaxremat._api.loss import training_loss

  entry = zoo_registry.get("vgg11-w0.25")
  model, x = entry.build(), entry.example()
  params = jax.eval_shape(model.init, jax.random.key(0), x)
  x = jax.ShapeDtypeStruct(x.shape, x.dtype)
  fitted = jaxremat.fit(model.apply, params, x, 0.5, target="h100")
  assert fitted.measured_total_bytes <= fitted.budget_bytes
  measured = jaxremat.measure(training_loss(fitted.fn, {}), params, x, target="h100")
  assert measured.total_bytes == fitted.measured_total_bytes


@needs_plugin
@pytest.mark.parametrize("segment", [1, 2, 4])
def test_segmented_scan_predicted_for_the_target(segment):
  """A segmented scan's recompute-then-backward is compiled for the GPU target, not
  estimated by the CPU's rule: the prediction comes within 10% of the GPU compiler's
  footprint of the step (the CPU rule said +50% to +90% on a 12-block stack)."""
  model = ScannedMLP(width=256, hidden=1024, outputs=10)
  x = jax.ShapeDtypeStruct((2048, 64), jnp.float32)
  params = jax.eval_shape(model.init, jax.random.key(0), x)
  r = jaxremat.apply(model.apply, params, x, target="h100", scan_segment=segment)
  assert [s.segment for s in r.scans] == [segment] and r.measured_total_bytes
  loss = lambda p, b: jnp.mean(jnp.square(r.fn(p, b)))  # noqa: E731
  assert r.measured_total_bytes == jaxremat.measure(loss, params, x, target="h100").total_bytes
  assert abs(r.predicted_total_bytes / r.measured_total_bytes - 1) < 0.10


class _Bf16Block(nn.Module):
  """Pre-LN attention and MLP in bf16."""

  @nn.compact
  def __call__(self, x):
    h = nn.LayerNorm(dtype=jnp.bfloat16)(x)
    x = x + nn.MultiHeadDotProductAttention(num_heads=4, dtype=jnp.bfloat16)(h, h)
    h = nn.Dense(256, dtype=jnp.bfloat16)(nn.LayerNorm(dtype=jnp.bfloat16)(x))
    return x + nn.Dense(64, dtype=jnp.bfloat16)(nn.gelu(h))


@needs_plugin
def test_the_replay_turns_where_the_backward_begins():
  """bf16 attention over 197 tokens: XLA's GPU schedule pads each block's attention
  probabilities for the backward during the forward. The compiled profile took the
  first such padding for the turn into the backward and replayed segments of several
  blocks 21-23% low (a user's bf16 ViT: 57% low, and a plan 2.3x the least); its
  backward begins with the last layer, after the whole forward."""
  model = nn.Sequential([nn.Dense(64, dtype=jnp.bfloat16), _Bf16Block(), _Bf16Block(),
                         _Bf16Block(), lambda x: x[:, 0], nn.Dense(10)])
  x = jax.ShapeDtypeStruct((4, 197, 48), jnp.bfloat16)
  params = jax.eval_shape(model.init, jax.random.key(0), x)
  r = jaxremat.apply(model.apply, params, x, target="h100", verify=False)
  replay, n = r._planner.replay, r.chain.n
  assert max(replay.forward_layer) == replay.backward_layer[0] == n - 1
  for k in (1, 2, 3):
    plan = jaxremat.solvers.uniform_plan(n, k)
    xla = jaxremat.apply(model.apply, params, x, target="h100", plan=plan, verify=True)
    assert r.predict_total_bytes(plan) == pytest.approx(xla.measured_total_bytes, rel=0.03)
