"""Planning from abstract inputs, and the compile path that keeps remat on CPU."""

import warnings

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jaxremat
from jaxremat import zoo

pytestmark = pytest.mark.xla  # compiles with XLA: the slow set

X = jax.random.normal(jax.random.key(1), (32, 20))
MODEL = zoo.mlp([64, 256, 64, 256, 64, 10])


def _loss(fn):
  return lambda p, x: jnp.mean(jnp.square(fn(p, x)))


def test_abstract_inputs_plan_as_concrete_ones_do():
  """ShapeDtypeStructs (from jax.eval_shape) give the same plan and prediction, and the
  drop-in then runs on real arrays with the plain model's gradients."""
  abstract = jax.eval_shape(MODEL.init, jax.random.key(0), X)
  r = jaxremat.apply(MODEL.apply, abstract, jax.ShapeDtypeStruct(X.shape, X.dtype))
  params = MODEL.init(jax.random.key(0), X)
  concrete = jaxremat.apply(MODEL.apply, params, X)
  assert r.plan == concrete.plan and r.plan.checkpoints
  assert r.predicted_total_bytes == concrete.predicted_total_bytes
  want = jax.grad(_loss(MODEL.apply))(params, X)
  got = jaxremat.jit(jax.grad(_loss(r.fn)))(params, X)
  for w, g in zip(jax.tree_util.tree_leaves(want), jax.tree_util.tree_leaves(got)):
    np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-6)


def test_abstract_inputs_verify_by_compiling_without_arrays():
  abstract = jax.eval_shape(MODEL.init, jax.random.key(0), X)
  x = jax.ShapeDtypeStruct(X.shape, X.dtype)
  r = jaxremat.apply(MODEL.apply, abstract, x, verify=True)
  assert r.plan.checkpoints in r.verified
  assert r.verified[r.plan.checkpoints] == jaxremat.measure(_loss(r.fn), abstract, x).total_bytes


@pytest.mark.skipif(jax.default_backend() != "cpu", reason="the barrier pass is CPU's")
def test_plain_jit_on_cpu_warns_and_jaxremat_jit_keeps_remat(monkeypatch):
  """Without the process flag, a plain jax.jit of the step warns; jaxremat.jit does not,
  and its compile is as small as jaxremat.measure's (remat kept), below no remat."""
  monkeypatch.setenv("XLA_FLAGS", "")  # as a user's process starts
  params = MODEL.init(jax.random.key(0), X)
  r = jaxremat.apply(MODEL.apply, params, X)
  step = jax.grad(_loss(r.fn))
  with pytest.warns(jaxremat.RematUndoneWarning, match="jaxremat.jit"):
    jax.jit(step).lower(params, X)
  with pytest.warns(jaxremat.RematUndoneWarning):  # the jit outside the grad is seen
    jax.jit(jax.vmap(step, in_axes=(None, 0))).lower(params, X[None])
  with warnings.catch_warnings():
    warnings.simplefilter("error")
    step(params, X)  # an eager grad compiles no step: nothing to warn about
    compiled = jaxremat.jit(step).lower(params, X).compile()
  stats = compiled.memory_analysis()
  total = (stats.argument_size_in_bytes + stats.output_size_in_bytes + stats.temp_size_in_bytes
           - stats.alias_size_in_bytes)
  assert total == jaxremat.measure(_loss(r.fn), params, X).total_bytes
  assert total < jaxremat.measure(_loss(MODEL.apply), params, X).total_bytes


@pytest.mark.skipif(jax.default_backend() != "cpu", reason="the barrier pass is CPU's")
def test_a_drop_in_without_barriers_does_not_warn(monkeypatch):
  """A plan without checkpoints between layers (here the model as written; a plan that
  segments only scans is the same to the check) has nothing a plain jax.jit could undo;
  one with checkpoints at an inner level only does."""
  monkeypatch.setenv("XLA_FLAGS", "")
  params = MODEL.init(jax.random.key(0), X)
  r = jaxremat.apply(MODEL.apply, params, X, plan=jaxremat.Plan(()), verify=False)
  with warnings.catch_warnings():
    warnings.simplefilter("error")
    jax.jit(jax.grad(_loss(r.fn))).lower(params, X)
  multilevel = jaxremat.Plan((), inner=((0, jaxremat.Plan((2,))),))
  r = jaxremat.apply(MODEL.apply, params, X, plan=multilevel, verify=False)
  with pytest.warns(jaxremat.RematUndoneWarning):  # an inner level has barriers
    jax.jit(jax.grad(_loss(r.fn))).lower(params, X)


def test_jaxremat_jit_passes_jit_options_and_works_as_a_decorator():
  params = MODEL.init(jax.random.key(0), X)
  r = jaxremat.apply(MODEL.apply, params, X)

  @jaxremat.jit(static_argnames="scale")
  def step(p, x, scale):
    return jax.grad(_loss(r.fn))(p, x * scale)

  got = step(params, X, scale=2.0)
  want = jax.grad(_loss(MODEL.apply))(params, X * 2.0)
  for w, g in zip(jax.tree_util.tree_leaves(want), jax.tree_util.tree_leaves(got)):
    np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-6)
