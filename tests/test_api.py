"""jaxremat.apply end to end: the drop-in gives the same outputs and gradients as the model."""

import functools
import warnings

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

import jaxremat
from jaxremat import zoo

pytestmark = pytest.mark.xla  # compiles with XLA: the slow set

KEY = jax.random.key(0)

# (name, model, input, kwargs for apply, tolerance)
ZOO = [
    ("mlp", zoo.mlp([64, 128, 32, 96, 10]), jnp.ones((8, 20)), {}, 1e-5),
    ("cnn", nn.Sequential([nn.Conv(8, (3, 3)), nn.relu, zoo.max_pool_2x2, nn.Conv(16, (3, 3)),
                           nn.relu, zoo.max_pool_2x2, zoo.flatten, nn.Dense(10)]),
     jax.random.normal(KEY, (4, 16, 16, 3)), {}, 1e-5),
    ("resnet-batchnorm", zoo.resnet((1, 1), width=8), jax.random.normal(KEY, (4, 16, 16, 3)),
     {"mutable": ["batch_stats"]}, 1e-4),
    ("dropout", zoo.DropoutMLP((32, 64, 32, 10), rate=0.3), jnp.ones((8, 20)),
     {"rngs": {"dropout": jax.random.key(7)}}, 1e-5),
    ("bf16", zoo.mlp([64, 128, 32, 10], dtype=jnp.bfloat16), jnp.ones((8, 20), jnp.bfloat16), {}, 2e-2),
]
PLANS = ["none", "every-layer", "sqrt", "optimal"]


def _init(model, x, kwargs):
  rngs = {"params": KEY, **kwargs.get("rngs", {})}
  return model.init(rngs, x)


def _loss(fn, kwargs):
  def loss(params, x):
    out = fn(params, x, **kwargs)
    leaves = jax.tree_util.tree_leaves(out)
    return sum(jnp.mean(jnp.square(leaf.astype(jnp.float32))) for leaf in leaves)
  return loss


def _assert_trees_close(a, b, tol):
  for (path, x), y in zip(jax.tree_util.tree_leaves_with_path(a), jax.tree_util.tree_leaves(b)):
    x32, y32 = np.asarray(x, np.float32), np.asarray(y, np.float32)
    scale = max(1.0, float(np.max(np.abs(x32))))
    np.testing.assert_allclose(y32, x32, atol=tol * scale, rtol=tol, err_msg=jax.tree_util.keystr(path))


@pytest.mark.parametrize("method", PLANS)
@pytest.mark.parametrize("name,model,x,kwargs,tol", ZOO, ids=[z[0] for z in ZOO])
def test_gradients_equal_plain_gradients(name, model, x, kwargs, tol, method):
  params = _init(model, x, kwargs)
  r = jaxremat.apply(model.apply, params, x, method=method, **kwargs)
  assert r.chain.n >= 3
  want = jax.jit(jax.grad(_loss(model.apply, kwargs)))(params, x)
  got = jax.jit(jax.grad(_loss(r.fn, kwargs)))(params, x)
  assert jax.tree_util.tree_structure(got) == jax.tree_util.tree_structure(want)
  _assert_trees_close(want, got, tol)
  _assert_trees_close(model.apply(params, x, **kwargs), r.fn(params, x, **kwargs), tol)


def test_params_tree_untouched_and_outputs_are_pytrees():
  model = zoo.resnet((1,), width=4)
  x = jnp.ones((2, 8, 8, 3))
  params = _init(model, x, {})
  before = jax.tree_util.tree_map(np.asarray, params)
  r = jaxremat.apply(model.apply, params, x, method="every-layer", mutable=["batch_stats"])
  out, state = r.fn(params, x, mutable=["batch_stats"])
  want_out, want_state = model.apply(params, x, mutable=["batch_stats"])
  _assert_trees_close(want_out, out, 1e-5)
  _assert_trees_close(want_state, state, 1e-5)
  _assert_trees_close(before, params, 0.0)


def test_under_jit_vmap_and_value_and_grad():
  model = zoo.mlp([16, 32, 8])
  x = jax.random.normal(KEY, (6, 5))
  params = _init(model, x, {})
  r = jaxremat.apply(model.apply, params, x, method="every-layer")
  np.testing.assert_allclose(jax.jit(r.fn)(params, x), model.apply(params, x), rtol=1e-6)
  per_example = jax.vmap(r.fn, in_axes=(None, 0))(params, x)
  np.testing.assert_allclose(per_example, model.apply(params, x), rtol=1e-5, atol=1e-6)
  loss = _loss(r.fn, {})
  value, grads = jax.value_and_grad(loss)(params, x)
  np.testing.assert_allclose(value, _loss(model.apply, {})(params, x), rtol=1e-6)
  _assert_trees_close(jax.grad(_loss(model.apply, {}))(params, x), grads, 1e-5)


def test_new_batch_size_reuses_the_plan():
  model = zoo.mlp([16, 32, 8])
  params = _init(model, jnp.ones((4, 5)), {})
  r = jaxremat.apply(model.apply, params, jnp.ones((4, 5)), method="every-layer")
  x = jax.random.normal(KEY, (9, 5))
  np.testing.assert_allclose(r.fn(params, x), model.apply(params, x), rtol=1e-6)


def test_outer_jit_is_looked_through():
  model = zoo.mlp([16, 32, 16, 8])
  x = jnp.ones((4, 5))
  params = _init(model, x, {})
  r = jaxremat.apply(jax.jit(model.apply), params, x)
  assert r.chain.n == 7


def test_layer_names_follow_flax_modules():
  model = zoo.mlp([16, 32, 8])
  params = _init(model, jnp.ones((4, 5)), {})
  r = jaxremat.apply(model.apply, params, jnp.ones((4, 5)))
  assert r.chain.names == ("layers_0", "(relu)", "layers_2", "(relu)#2", "layers_4")


def test_profile_bytes_are_dtype_aware():
  x = jnp.ones((8, 20), jnp.bfloat16)
  for dtype, itemsize in ((jnp.float32, 4), (jnp.bfloat16, 2)):
    model = zoo.mlp([64, 32, 10], dtype=dtype)
    params = _init(model, x, {})
    chain = jaxremat.apply(model.apply, params, x).chain
    assert chain.act_bytes[1] == 8 * 64 * itemsize  # Dense output
    assert chain.act_bytes[-1] == 8 * 10 * itemsize
    assert chain.act_bytes[0] == 8 * 20 * 2  # the bf16 batch
    assert chain.input_res_bytes[2] == 8 * 64 * itemsize  # the second Dense saves its input


def test_report_lists_every_layer_and_strategy():
  model = zoo.mlp([16, 32, 8])
  params = _init(model, jnp.ones((4, 5)), {})
  text = jaxremat.apply(model.apply, params, jnp.ones((4, 5))).report()
  for word in ("layers_0", "(relu)", "layers_4", "none", "every-layer", "sqrt", "optimal"):
    assert word in text


def test_report_lists_each_compiled_plan_with_xlas_figure():
  # a user's trial read a chosen plan predicted above every-layer as a contradiction:
  # the report now shows what XLA measured of each plan it compiled
  from jaxremat._api.planning import fmt_bytes
  model = zoo.mlp([64, 256, 32, 256, 8])
  x = jnp.ones((32, 16))
  r = jaxremat.apply(model.apply, _init(model, x, {}), x, verify=True)
  assert len(r.verified) > 1
  listing = r.report().split("plans compiled, XLA-measured (predicted):\n")[1].splitlines()
  rows = listing[:len(r.verified)]
  for checkpoints, measured in r.verified.items():
    assert any(row.split()[:2] == fmt_bytes(measured).split() and f"{list(checkpoints)}" in row
               for row in rows), (checkpoints, rows)
  chosen = [row for row in rows if row.endswith("<- chosen")]
  assert len(chosen) == 1 and f"{list(r.plan.checkpoints)}" in chosen[0]
  assert chosen[0].split()[:2] == fmt_bytes(r.measured_total_bytes).split()


def test_report_says_when_every_plan_compiled_measures_the_same():
  # a user's MoE net: four plans at 44.08 MiB, its peak inside a block
  import dataclasses
  model = zoo.mlp([64, 256, 32, 256, 8])
  x = jnp.ones((32, 16))
  r = jaxremat.apply(model.apply, _init(model, x, {}), x, verify=False)
  plans = [(1, 2), (2,), (1, 2, 3)]
  hint = "every plan compiled measures the same"
  assert hint in dataclasses.replace(r, verified=dict.fromkeys(plans, 1000)).report()
  apart = dataclasses.replace(r, verified=dict(zip(plans, (1000, 1100, 1000))))
  assert hint not in apart.report()
  assert "layer_depth='search'" in dataclasses.replace(r, verified=dict.fromkeys(plans, 1000)
                                                       ).report()


def test_default_apply_points_to_search_where_a_layer_holds_wide_residuals():
  """A user's nnx LM got every block recomputed alone (63.25 MiB, a block's residuals 34
  times its output) and was not told that the search reached 45.47 MiB. Where the hint
  shows, XLA measures the search's plan lower; an MLP of plain layers gets none."""
  model = zoo.gpt(vocab_size=128, max_len=64, dim=32, depth=4, num_heads=4)
  x = jax.random.randint(KEY, (8, 64), 0, 128)
  params = _init(model, x, {})
  hint = "layer_depth='search' plans inside the layers too"
  r = jaxremat.apply(model.apply, params, x)
  assert hint in r.decomposition and hint in r.report()
  searched = jaxremat.apply(model.apply, params, x, layer_depth="search")
  assert hint not in searched.decomposition
  assert searched.measured_total_bytes < r.measured_total_bytes
  plain = zoo.mlp([64, 256, 32, 256, 8])
  x = jnp.ones((32, 16))
  assert hint not in jaxremat.apply(plain.apply, _init(plain, x, {}), x).decomposition


def test_report_of_a_segmented_scan_points_nowhere_search_does_not_go():
  """A user's scanned encoder: every plan measured the same and the report pointed to
  layer_depth='search', which does not plan below a segmented scanned stack."""
  import dataclasses
  from scan_models import ScannedMLP
  model = ScannedMLP(width=32, hidden=64, outputs=4, depth=4)
  x = jnp.ones((8, 16))
  r = jaxremat.apply(model.apply, _init(model, x, {}), x, verify=False)
  assert r.scans
  report = dataclasses.replace(r, verified=dict.fromkeys([(1,), (2,), (1, 2)], 1000)).report()
  assert "every plan compiled measures the same" in report
  assert "layer_depth='search'" not in report
  assert "\nnone (scans segmented) " in report  # not the model as written (a trial misread it)


@pytest.mark.parametrize("plan,regions", [
    (jaxremat.Plan((6,), inner=((0, jaxremat.Plan((2, 4))),)), 3),
    (jaxremat.Plan((3, 6), inner=((0, jaxremat.Plan((1,))),
                                  (3, jaxremat.Plan((5,), inner=((3, jaxremat.Plan((4,))),))))), 5),
    (jaxremat.Plan((), inner=((0, jaxremat.Plan((4,))),)), 1),
], ids=["two-level", "three-level", "inner-only"])
def test_nested_plans_give_equal_gradients(plan, regions):
  model = zoo.mlp([64, 128, 32, 96, 48, 10])
  x = jax.random.normal(KEY, (8, 20))
  params = _init(model, x, {})
  r = jaxremat.apply(model.apply, params, x, plan=plan)
  want = jax.jit(jax.grad(_loss(model.apply, {})))(params, x)
  got = jax.jit(jax.grad(_loss(r.fn, {})))(params, x)
  _assert_trees_close(want, got, 1e-5)
  forward = str(jax.make_jaxpr(r.fn)(params, x))
  assert forward.count("prevent_cse=True") == regions  # one jax.checkpoint per remat segment


def test_nested_plan_outside_its_segment_is_rejected():
  model = zoo.mlp([8, 8, 8])
  x = jnp.ones((2, 4))
  bad = jaxremat.Plan((2,), inner=((0, jaxremat.Plan((3,))),))
  with pytest.raises(jaxremat.InvalidPlanError, match=r"inner checkpoints \[3\] lie outside the segment \(0, 2\]"):
    jaxremat.apply(model.apply, _init(model, x, {}), x, plan=bad)


def test_layer_depth_splits_children_into_their_submodules():
  inner = lambda: nn.Sequential([nn.Dense(8), nn.relu, nn.Dense(8)])  # noqa: E731
  model = nn.Sequential([inner(), inner()])
  x = jnp.ones((2, 3))
  params = _init(model, x, {})
  with pytest.warns(jaxremat.CoarseLayersWarning, match="layer_depth=2"):  # too coarse to save
    by_depth = jaxremat.apply(model.apply, params, x, layer_depth=1)
  assert by_depth.chain.names == ("layers_0", "layers_1")
  # By default each child (half of the activation bytes) is split too, at no cost to the chain.
  assert jaxremat.apply(model.apply, params, x).chain.names == (
      "layers_0/layers_0", "layers_0/(relu)", "layers_0/layers_2",
      "layers_1/layers_0", "layers_1/(relu)", "layers_1/layers_2")
  r = jaxremat.apply(model.apply, params, x, layer_depth=2, method="every-layer")
  assert r.chain.names[0] == "layers_0/layers_0" and r.chain.n == 6
  _assert_trees_close(jax.grad(_loss(model.apply, {}))(params, x), jax.grad(_loss(r.fn, {}))(params, x), 1e-5)


def test_a_given_plan_is_confirmed_by_one_compile():
  """apply(plan=...) reports XLA's footprint of that plan by default, as it does for a
  plan of its own (a user's trial: None, with the docs saying it confirms), and compiles
  nothing with verify=False."""
  model, x = zoo.mlp([64, 128, 32, 96, 10]), jnp.ones((8, 20))
  params = _init(model, x, {})
  plan = jaxremat.Plan((2, 4))
  r = jaxremat.apply(model.apply, params, x, plan=plan)
  assert r.plan == plan and set(r.verified) == {plan.checkpoints}
  assert r.measured_total_bytes == jaxremat.measure(_loss(r.fn, {}), params, x).total_bytes
  assert jaxremat.apply(model.apply, params, x, plan=plan, verify=False).verified is None


def test_an_error_the_model_raises_when_traced_says_how_model_fn_is_called():
  # A user's two mistakes from a trial: the inner params dict, a (tokens, labels) tuple.
  # The model's own exception is raised, with a note on how jaxremat called it.
  model = zoo.mlp([16, 8])
  x = jnp.ones((4, 12))
  params = model.init(jax.random.PRNGKey(0), x)
  for bad_params, batch in ((params["params"], x), (params, (x, jnp.zeros(4, jnp.int32)))):
    with pytest.raises(Exception) as raised:
      jaxremat.apply(model.apply, bad_params, batch)
    note = "\n".join(getattr(raised.value, "__notes__", []))
    assert "the whole variables dict ({'params': ...}" in note
    assert "float32[4, 12]" in note


def test_flaxs_errors_of_a_missing_rng_or_mutable_say_what_to_pass():
  # a user's trial: train=True without rngs=, BatchNorm in training without mutable=
  class Net(nn.Module):
    @nn.compact
    def __call__(self, x, train=False):
      x = nn.BatchNorm(use_running_average=not train)(nn.Dense(8)(x))
      return nn.Dense(4)(nn.Dropout(0.5, deterministic=not train)(x))

  x = jnp.ones((4, 12))
  params = Net().init(jax.random.key(0), x)
  cases = (({"train": True, "mutable": ["batch_stats"]},
            "pass rngs={'dropout': jax.random.key(0)} to jaxremat"),
           ({"train": True, "rngs": {"dropout": jax.random.key(1)}},
            "pass mutable=['batch_stats']"))
  for kwargs, hint in cases:
    with pytest.raises(Exception) as raised:
      jaxremat.apply(Net().apply, params, x, **kwargs)
    note = "\n".join(getattr(raised.value, "__notes__", []))
    assert hint in note and "to jaxremat as to model.apply" in note


class Denoiser(nn.Module):
  """A diffusion-style model: a noisy batch and its timesteps."""

  @nn.compact
  def __call__(self, x, t):
    return nn.Dense(4)(nn.relu(nn.Dense(16)(x) + t[:, None]))


@pytest.mark.filterwarnings("ignore::jaxremat.NoSavingWarning")  # three small layers
def test_a_model_of_two_inputs_says_to_pass_the_other_by_keyword():
  """A user's trial: a diffusion U-Net's timestep; the note said the batch is the one
  positional input, not how to pass the other."""
  x, t = jnp.ones((8, 5)), jnp.linspace(0, 1, 8)
  params = Denoiser().init(jax.random.key(0), x, t)
  with pytest.raises(TypeError) as raised:
    jaxremat.apply(Denoiser().apply, params, x)
  note = "\n".join(getattr(raised.value, "__notes__", []))
  assert "more inputs than the batch ('t')" in note
  assert "jaxremat.apply(model.apply, params, batch, t=t)" in note
  r = jaxremat.apply(Denoiser().apply, params, x, t=t, verify=False)
  np.testing.assert_allclose(r.fn(params, x, t=2 * t), Denoiser().apply(params, x, 2 * t),
                             rtol=1e-6)
  with pytest.raises(jaxremat.InvalidArgumentError, match=r"got an array of shape \(8,\): "
                     r"the model's other inputs go by keyword"):
    jaxremat.fit(Denoiser().apply, params, x, t)

  def scaled(x, scale):
    return x * scale

  class Buggy(nn.Module):  # a review: its own helper's missing argument is not the batch's
    @nn.compact
    def __call__(self, x):
      return nn.Dense(4)(scaled(x))  # type: ignore[call-arg]

  x5 = jnp.ones((8, 5))
  with pytest.raises(TypeError) as raised:
    jaxremat.apply(Buggy().apply, {"params": {"Dense_0": {"kernel": jnp.ones((5, 4))}}}, x5)
  assert "more inputs than the batch" not in "\n".join(getattr(raised.value, "__notes__", []))


def test_float_tokens_into_an_embedding_say_to_pass_integers():
  """A user's trial: float token ids into nn.Embed got the general note."""
  class Lm(nn.Module):
    @nn.compact
    def __call__(self, tokens):
      return nn.Dense(8)(nn.Embed(32, 16)(tokens))

  tokens = jnp.ones((4, 6), jnp.int32)
  params = Lm().init(jax.random.key(0), tokens)
  with pytest.raises(ValueError) as raised:
    jaxremat.apply(Lm().apply, params, tokens.astype(jnp.float32))
  note = "\n".join(getattr(raised.value, "__notes__", []))
  assert "batch float32[4, 6]" in note and "batch.astype(jnp.int32)" in note
  model = nnx.Embed(32, 16, rngs=nnx.Rngs(0))
  with pytest.raises(ValueError) as raised:
    jaxremat.apply_nnx(model, tokens.astype(jnp.float32))
  assert "batch.astype(jnp.int32)" in "\n".join(getattr(raised.value, "__notes__", []))


def test_an_error_an_nnx_module_raises_when_traced_says_labels_go_in_loss_fn():
  model = nnx.Linear(12, 8, rngs=nnx.Rngs(0))
  x = jnp.ones((4, 12))
  with pytest.raises(Exception) as raised:
    jaxremat.apply_nnx(model, (x, jnp.zeros(4, jnp.int32)))
  note = "\n".join(getattr(raised.value, "__notes__", []))
  assert "traced as model(batch)" in note and "labels for the loss go in loss_fn=" in note


def test_a_batch_without_its_batch_axis_is_warned_of():
  """A user's trial: one example, shape (64,), was planned as written with only a
  NoSavingWarning that blamed nn.remat or coarse layers."""
  model = nn.Sequential([nn.Dense(256), nn.gelu, nn.Dense(256), nn.gelu, nn.Dense(10)])
  x = jnp.ones((64,))
  params = model.init(jax.random.key(0), x)
  for plan in (lambda: jaxremat.apply(model.apply, params, x, verify=False),
               lambda: jaxremat.fit(model.apply, params, x, 1.0, verify=False)):
    with pytest.warns(jaxremat.BatchAxisWarning, match=r"pass a batch of them: shape \(N, 64\)"):
      plan()
  batched = jnp.ones((8, 64))
  with warnings.catch_warnings():
    warnings.simplefilter("error", jaxremat.BatchAxisWarning)
    jaxremat.apply(model.apply, params, batched, verify=False)


class _LoRADense(nn.Module):
  """A frozen kernel (collection 'params') and a rank-2 adapter (collection 'lora')."""
  features: int

  @nn.compact
  def __call__(self, x):
    kernel = self.param("kernel", nn.initializers.lecun_normal(), (x.shape[-1], self.features))
    a = self.variable("lora", "a", lambda: 0.1 * jnp.ones((x.shape[-1], 2))).value
    b = self.variable("lora", "b", lambda: 0.1 * jnp.ones((2, self.features))).value
    return nn.gelu(x @ kernel + (x @ a) @ b)


class _LoRAStack(nn.Module):
  @nn.compact
  def __call__(self, x):
    for _ in range(4):
      x = _LoRADense(256)(x)
    return x


def test_frozen_parameters_passed_as_a_keyword_array_are_not_differentiated():
  """LoRA as docs/usage.md writes it: the adapters are params, the frozen base a keyword
  array. The base's gradients are then not in the plan's fixed bytes (its training step
  differentiates the adapters alone), and gradients through ``r.fn`` are the plain ones."""
  model, x = _LoRAStack(), jax.random.normal(KEY, (64, 256))
  variables = model.init(KEY, x)
  base, lora = variables["params"], variables["lora"]

  def lora_apply(lora, x, base):
    return model.apply({"params": base, "lora": lora}, x)

  r = jaxremat.apply(lora_apply, lora, x, base=base)
  every = jaxremat.apply(model.apply, {"params": base, "lora": lora}, x)
  base_bytes = sum(np.asarray(leaf).nbytes for leaf in jax.tree_util.tree_leaves(base))
  assert every.fixed_bytes - r.fixed_bytes == base_bytes  # the base's gradients
  assert r.measured_total_bytes < every.measured_total_bytes

  def loss(fn, lora):
    return jnp.mean(fn(lora, x, base=base) ** 2)

  want, got = jax.grad(functools.partial(loss, lora_apply))(lora), jax.grad(
      functools.partial(loss, r.fn))(lora)
  for w, g in zip(jax.tree_util.tree_leaves(want), jax.tree_util.tree_leaves(got)):
    np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-6)
