"""apply's confirming compiles reach a plan of another structure when XLA measures the
estimate's ties alike (a user's trial: a conv ``nn.Sequential`` with GroupNorm)."""

import flax.linen as nn
import jax
import optax
import pytest

import jaxremat
from jaxremat.solvers import uniform_plan

pytestmark = pytest.mark.xla


def test_apply_reaches_the_least_checkpoint_every_k_plan_of_a_groupnorm_conv_net():
  layers = []
  for features, stride in [(16, 1), (32, 2), (32, 1), (64, 2), (64, 1), (64, 1)]:
    layers += [nn.Conv(features, (3, 3), strides=(stride, stride)), nn.GroupNorm(8), nn.swish]
  model = nn.Sequential([*layers, lambda x: x.mean(axis=(1, 2)), nn.Dense(10)])
  x = jax.random.normal(jax.random.key(0), (16, 32, 32, 3))
  labels = jax.random.randint(jax.random.key(1), (16,), 0, 10)
  params = model.init(jax.random.key(2), x)

  def loss_fn(logits):
    return optax.softmax_cross_entropy_with_integer_labels(logits, labels).mean()

  def footprint(fn):
    return jaxremat.measure(lambda p, b: loss_fn(fn(p, b)), params, x).total_bytes

  r = jaxremat.apply(model.apply, params, x, loss_fn=loss_fn)
  every_k = {k: footprint(jaxremat.apply(model.apply, params, x, loss_fn=loss_fn, verify=False,
                                         plan=uniform_plan(r.chain.n, k)).fn)
             for k in (2, 3, 4)}
  assert footprint(r.fn) <= min(every_k.values()) * 1.02
