"""Run by tests/test_sharding.py in a subprocess with 8 fake CPU devices (XLA_FLAGS must be
set before jax starts): an MLP on a ("data", "model") mesh, batch over data, Dense kernels
over model. Prints one JSON line of figures and exits non-zero on a failed check."""

import json
import os
import sys

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

import jaxremat
from jaxremat._jaxpr import sharding as _sharding
from jaxremat import zoo
from jaxremat.solvers import uniform_plan


def main() -> None:
  flags = os.environ.get("XLA_FLAGS")
  assert jax.device_count() == 8, f"expected 8 devices, got {jax.devices()} (XLA_FLAGS={flags})"
  mesh = Mesh(np.array(jax.devices()).reshape(4, 2), ("data", "model"))
  model = zoo.mlp([128] * 8 + [16])
  x = jax.random.normal(jax.random.key(1), (2048, 32))
  params = model.init(jax.random.key(0), x)

  def spec(path):
    return P(None, "model") if jax.tree_util.keystr(path).endswith("['kernel']") else P()

  p_shard = jax.tree_util.tree_map_with_path(lambda p, l: NamedSharding(mesh, spec(p)), params)
  params_s = jax.device_put(params, p_shard)
  x_s = jax.device_put(x, NamedSharding(mesh, P("data", None)))

  def loss(fn):
    return lambda p, b: jnp.mean(jnp.square(fn(p, b)))

  r = jaxremat.apply(model.apply, params_s, x_s)
  none = jaxremat.apply(model.apply, params_s, x_s, plan=jaxremat.Plan())
  try:  # the compiled profile replays one device's program: refused, as docs/errors.md says
    jaxremat.apply(model.apply, params_s, x_s, profile="compiled")
    refusal = ""
  except jaxremat.InvalidArgumentError as e:
    refusal = str(e)

  step = jax.jit(jax.grad(loss(r.fn)))
  got = step(params_s, x_s)
  want = jax.jit(jax.grad(loss(model.apply)))(params, x)
  for (path, a), b in zip(jax.tree_util.tree_leaves_with_path(want), jax.tree_util.tree_leaves(got)):
    np.testing.assert_allclose(np.asarray(b), np.asarray(a), rtol=1e-4, atol=1e-6,
                               err_msg=jax.tree_util.keystr(path))
  kernel = got["params"]["layers_0"]["kernel"]
  assert kernel.sharding.shard_shape(kernel.shape) == (32, 64), kernel.sharding

  fp_remat = jaxremat.measure(loss(r.fn), params_s, x_s)
  fp_none = jaxremat.measure(loss(model.apply), params_s, x_s)
  fp_global = jaxremat.measure(loss(r.fn), params, x)
  n = r.chain.n
  uniform = {k: jaxremat.measure(loss(jaxremat.apply(model.apply, params_s, x_s,
                                                      plan=uniform_plan(n, k)).fn),
                                 params_s, x_s).total_bytes for k in range(1, n)}
  print(json.dumps({
      "devices": jax.device_count(), "mesh": dict(mesh.shape),
      "checkpoints": list(r.plan.checkpoints),
      "profiled_input_bytes": r.chain.act_bytes[0], "batch_shard_bytes": _sharding.device_bytes(x_s),
      "measured_remat": fp_remat.total_bytes, "predicted_remat": r.predicted_total_bytes,
      "measured_none": fp_none.total_bytes, "predicted_none": none.predicted_total_bytes,
      "argument_bytes": fp_remat.argument_bytes,
      "params_batch_bytes_per_device": _sharding.tree_device_bytes((params_s, x_s)),
      "params_batch_bytes": _sharding.tree_device_bytes((params, x)),
      "measured_one_device": fp_global.total_bytes,
      "measured_best_uniform": min(uniform.values()),
      "best_uniform_k": min(uniform, key=uniform.get),
      "compiled_profile_refusal": refusal,
  }))


if __name__ == "__main__":
  sys.exit(main())
