"""The README's training example, run verbatim in a 10-step optax loop on CPU."""

import pathlib
import re

import jax
import numpy as np
import optax
import pytest

from jaxremat import zoo

pytestmark = pytest.mark.xla  # compiles with XLA: the slow set

README = pathlib.Path(__file__).resolve().parent.parent / "README.md"


def _example() -> str:
  """The README's first python block: the training example."""
  return re.search(r"```python\n(.*?)```", README.read_text(), re.S).group(1)


def _footprint(compiled) -> int:
  s = compiled.memory_analysis()
  return s.argument_size_in_bytes + s.output_size_in_bytes + s.temp_size_in_bytes - s.alias_size_in_bytes


def test_readme_example_trains_like_the_plain_model_in_less_memory(monkeypatch):
  monkeypatch.setenv("XLA_FLAGS", "")  # a user's process: no process-wide flag
  model = zoo.all_conv()  # the demo model: activations dominate its step
  key = jax.random.key(0)
  batch_x = jax.random.normal(jax.random.key(1), (32, 32, 32, 3))
  labels = jax.random.randint(jax.random.key(2), (32,), 0, 10)
  optimizer = optax.adam(1e-3)
  env = {"model": model, "key": key, "batch_x": batch_x, "optimizer": optimizer}
  exec(_example().replace("print(r.report())", "r.report()"), env)  # noqa: S102
  step = env["train_step"]

  def plain_step(params, opt_state, x, y):
    def loss_fn(p):
      return optax.softmax_cross_entropy_with_integer_labels(model.apply(p, x), y).mean()
    loss, grads = jax.value_and_grad(loss_fn)(params)
    updates, opt_state = optimizer.update(grads, opt_state)
    return optax.apply_updates(params, updates), opt_state, loss

  params = env["params"]
  args = (params, optimizer.init(params), batch_x, labels)
  remat_bytes = _footprint(step.lower(*args).compile())
  plain_bytes = _footprint(jax.jit(plain_step).lower(*args).compile(
      compiler_options={"xla_disable_hlo_passes": "cse_barrier_expander"}))
  assert remat_bytes < 0.95 * plain_bytes, (remat_bytes, plain_bytes)
  ours, plain = args[:2], args[:2]
  for _ in range(10):
    *ours, loss = step(*ours, batch_x, labels)
    *plain, want = jax.jit(plain_step)(*plain, batch_x, labels)
    np.testing.assert_allclose(loss, want, rtol=1e-5)
  for a, b in zip(jax.tree_util.tree_leaves(ours[0]), jax.tree_util.tree_leaves(plain[0])):
    np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-5)
