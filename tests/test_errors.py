"""Bad input gets a specific jaxremat error at the API boundary."""

import flax.linen as nn
import jax
import jax.numpy as jnp
import pytest

import jaxremat
from jaxremat import zoo


class SkipAcrossLayers(nn.Module):
  """Layer 3 adds the output of layer 1: not a chain at module granularity."""

  @nn.compact
  def __call__(self, x):
    h = nn.Dense(8, name="first")(x)
    y = nn.Dense(8, name="second")(h)
    return nn.Dense(8, name="third")(y) + h


class WithCallback(nn.Module):
  @nn.compact
  def __call__(self, x):
    x = nn.Dense(8)(x)
    jax.debug.print("{}", x.sum())
    return nn.Dense(8)(x)


def _params(model, x):
  return model.init(jax.random.key(0), x)


def test_skip_connection_across_layers_names_the_layers():
  """The chain tracer names the layers; apply then plans the model as a graph."""
  from jaxremat._trace import trace
  x = jnp.ones((2, 4))
  model = SkipAcrossLayers()
  with pytest.raises(jaxremat.NotAChainError, match=r"reads a value made by layer 1 'first'.*skipping over layer 2 'second'"):
    trace(model.apply, _params(model, x), x, {})
  assert isinstance(jaxremat.apply(model.apply, _params(model, x), x), jaxremat.GraphRemat)


def test_effects_are_rejected():
  x = jnp.ones((2, 4))
  model = WithCallback()
  with pytest.raises(jaxremat.UnsupportedModelError, match="side effects"):
    jaxremat.apply(model.apply, _params(model, x), x)


def test_model_without_layers():
  with pytest.raises(jaxremat.EmptyModelError, match="no layers"):
    jaxremat.apply(lambda p, x: x, {"w": jnp.ones(3)}, jnp.ones(3))


def test_non_array_leaves():
  with pytest.raises(TypeError, match=r"params\['w'\] is a str"):
    jaxremat.apply(lambda p, x: x * 2, {"w": "hello"}, jnp.ones(3))
  with pytest.raises(TypeError, match="model_fn must be callable"):
    jaxremat.apply("not a function", {}, jnp.ones(3))


def test_unknown_method():
  model = zoo.mlp([8, 8])
  x = jnp.ones((2, 4))
  with pytest.raises(jaxremat.UnknownMethodError, match="unknown method 'fastest'.*optimal"):
    jaxremat.apply(model.apply, _params(model, x), x, method="fastest")


def test_plan_out_of_range():
  model = zoo.mlp([8, 8])
  x = jnp.ones((2, 4))
  with pytest.raises(jaxremat.InvalidPlanError, match=r"out of range for a chain of 3 layers; valid indices are 1..2"):
    jaxremat.apply(model.apply, _params(model, x), x, plan=jaxremat.Plan((3,)))


def test_inputs_with_other_layers_are_rejected():
  model = zoo.mlp([8, 8, 8])
  x = jnp.ones((2, 4))
  params = _params(model, x)
  r = jaxremat.apply(model.apply, params, x)
  with pytest.raises(jaxremat.InputMismatchError, match=r"model fails on a batch of shapes \[\(2, 5\)\]"):
    r.fn(params, jnp.ones((2, 5)))


def test_params_of_another_shape_are_rejected():
  model = zoo.mlp([8, 8, 8])
  x = jnp.ones((2, 4))
  params = _params(model, x)
  r = jaxremat.apply(model.apply, params, x)
  other = _params(model, jnp.ones((2, 5)))
  with pytest.raises(jaxremat.InputMismatchError, match=r"params do not match.*\(5, 8\).*expected \(\(4, 8\)"):
    r.fn(other, jnp.ones((2, 5)))
