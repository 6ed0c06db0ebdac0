"""Bad input gets a specific jaxremat error at the API boundary: one case per row of
docs/errors.md, each asserting the error class and a key phrase of its message."""

import dataclasses
import functools
import pathlib
import re
import sys
import warnings
from collections.abc import Callable
from typing import Any
from unittest import mock

import flax
import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

import jaxremat
from jaxremat import zoo

pytestmark = pytest.mark.xla  # compiles with XLA: the slow set

ERRORS_MD = pathlib.Path(__file__).resolve().parent.parent / "docs" / "errors.md"


class SkipAcrossLayers(nn.Module):
  """Layer 3 adds the output of layer 1: not a chain at module granularity."""

  @nn.compact
  def __call__(self, x):
    h = nn.Dense(8, name="first")(x)
    y = nn.Dense(8, name="second")(h)
    return nn.Dense(8, name="third")(y) + h


class WithPrint(nn.Module):
  @nn.compact
  def __call__(self, x):
    x = nn.Dense(8)(x)
    jax.debug.print("{}", x.sum())
    return nn.Dense(8)(x)


class WithCallback(nn.Module):
  @nn.compact
  def __call__(self, x):
    x = nn.Dense(8)(x)
    x = jax.pure_callback(lambda a: a, jax.ShapeDtypeStruct(x.shape, x.dtype), x)
    return nn.Dense(8)(x)


class DeeperForBigBatches(nn.Module):
  """One more (parameter-free) layer when the batch has more than 2 rows."""

  @nn.compact
  def __call__(self, x):
    x = nn.Dense(8)(x)
    if x.shape[0] > 2:
      x = jnp.tanh(x)
    return nn.Dense(8)(x)


def test_skip_connection_across_layers_names_the_layers():
  """The tracer names the skipping layers; apply plans the model as a graph, and an
  option graphs do not take names them too."""
  from jaxremat._jaxpr.trace import trace
  x = jnp.ones((2, 4))
  model = SkipAcrossLayers()
  params = model.init(jax.random.key(0), x)
  reason = r"reads a value made by layer 1 'first'.*skipping over layer 2 'second'"
  assert re.search(reason, trace(model.apply, params, x, {}).not_a_chain)
  with warnings.catch_warnings():  # a model this small saves nothing: it says so
    warnings.simplefilter("ignore", jaxremat.NoSavingWarning)
    assert jaxremat.apply(model.apply, params, x).is_graph
  with pytest.raises(jaxremat.NotAChainError, match=reason + ".*method='sqrt'"):
    jaxremat.apply(model.apply, params, x, method="sqrt")


X = jnp.ones((2, 4))


@functools.cache
def mlp():
  """A three-layer MLP (Dense, relu, Dense, relu, Dense: 5 layers), its params and a Remat."""
  model = zoo.mlp([8, 8, 8])
  params = model.init(jax.random.key(0), X)
  return model, params, jaxremat.apply(model.apply, params, X)


STACK = jnp.ones((4, 4, 4)) / 4  # four stacked 4x4 layers


def scan_stack(w, x):
  return jax.lax.scan(lambda h, wi: (jnp.tanh(h @ wi), None), x, w)[0]


def scan_carrying_a_count(w, x):
  """The carry counts layers; the activation enters every layer from outside the loop."""
  return jax.lax.scan(lambda c, wi: (c + 1.0, jnp.tanh(x @ wi)), jnp.zeros(()), w)[1].sum(0)


def apply_to(model, x=X, **kwargs):
  return jaxremat.apply(model.apply, model.init(jax.random.key(0), x), x, **kwargs)


def held_bytes(params, batch):
  """Bytes of params, batch and parameter gradients, summed leaf by leaf with numpy."""
  leaves = jax.tree_util.tree_leaves(params)
  return 2 * sum(np.asarray(a).nbytes for a in leaves) + np.asarray(batch).nbytes


#: A budget above what the MLP's params, batch and gradients hold, below any step's
#: footprint (its activations come on top).
BELOW_LEAST = held_bytes(mlp()[1], X) + 8


def apply_mlp(**kwargs):
  model, params, _ = mlp()
  return jaxremat.apply(model.apply, params, X, **kwargs)


def dict_batch_drop_in():
  """The zoo MLP reading a dict batch, its drop-in called with one leaf of another shape."""
  model = zoo.mlp([8, 8, 8])
  apply = lambda p, batch: model.apply(p, batch["x"]) * batch["scale"][:, None]  # noqa: E731
  batch = {"x": X, "scale": jnp.ones(X.shape[0])}
  params = model.init(jax.random.key(0), X)
  r = jaxremat.apply(apply, params, batch, verify=False)
  return r.fn(params, {"x": jnp.ones((X.shape[0], 5)), "scale": batch["scale"]})


def call_drop_in(params_fn=lambda p: p, batch=X):
  _, params, r = mlp()
  return r.fn(params_fn(params), batch)


CHAIN = jaxremat.Chain([4, 4, 4, 4], [4, 4, 4])


def without_matplotlib():
  _, _, r = mlp()
  with mock.patch.dict(sys.modules, {"matplotlib": None, "matplotlib.pyplot": None}):
    r.plot("unused.png")


def measure_for_h100_without_the_plugin():
  from jaxremat._backends import targets
  model, params, _ = mlp()
  with mock.patch.object(targets, "_installed", return_value=False):
    jaxremat.measure(lambda p, x: jnp.mean(model.apply(p, x)), params, X, target="h100")


def other_layers_on_bigger_batch():
  model = DeeperForBigBatches()
  params = model.init(jax.random.key(0), X)
  with warnings.catch_warnings():  # two layers at this batch: no checkpoint saves, it says
    warnings.simplefilter("ignore", jaxremat.NoSavingWarning)
    r = jaxremat.apply(model.apply, params, X)
  r.fn(params, jnp.ones((3, 4)))


class NormedMLP(nn.Module):
  @nn.compact
  def __call__(self, x):
    x = nn.BatchNorm(use_running_average=False)(nn.relu(nn.Dense(8)(x)))
    return nn.Dense(4)(nn.relu(nn.Dense(8)(x)))


def loss_of_the_state_with_mutable():
  """A user's trial: with mutable=, loss_fn written for (logits, state)."""
  model = NormedMLP()
  variables = model.init(jax.random.key(0), X)
  return jaxremat.apply(model.apply, variables, X, mutable=["batch_stats"], verify=False,
                        loss_fn=lambda out: jnp.mean(out[1]["batch_stats"]))


class DropoutWhenTraining(nn.Module):
  @nn.compact
  def __call__(self, x, train=False):
    x = nn.Dropout(0.5, deterministic=not train)(nn.relu(nn.Dense(8)(x)))
    return nn.Dense(4)(nn.relu(nn.Dense(8)(x)))


def planned_for_evaluation_called_for_training():
  model = DropoutWhenTraining()
  params = model.init(jax.random.key(0), X)
  r = jaxremat.apply(model.apply, params, X)
  r.fn(params, X, train=True, rngs={"dropout": jax.random.key(1)})


def flag_traced_by_jit():
  """``train=True`` passed through ``jax.jit``, which makes it a traced ``bool[]``."""
  model = DropoutWhenTraining()
  params = model.init(jax.random.key(0), X)
  rngs = {"dropout": jax.random.key(1)}
  r = jaxremat.apply(model.apply, params, X, train=True, rngs=rngs, verify=False)
  jaxremat.jit(r.fn)(params, X[:1], train=True, rngs=rngs)


class NnxMLP(nnx.Module):
  def __init__(self, rngs: nnx.Rngs):
    self.a, self.b = nnx.Linear(4, 8, rngs=rngs), nnx.Linear(8, 4, rngs=rngs)

  def __call__(self, x):
    return self.b(nnx.relu(self.a(x)))


def nnx_drop_in() -> tuple[NnxMLP, Any]:
  """A small nnx model and ``apply_nnx``'s result for it."""
  model = NnxMLP(nnx.Rngs(0))
  return model, jaxremat.apply_nnx(model, X, verify=False)


@dataclasses.dataclass(frozen=True)
class Case:
  id: str
  call: Callable[[], Any]
  error: type
  phrase: str  # a regular expression the message must contain


CASES = [
    # Arguments of the wrong type or range.
    Case("non-array-leaf", lambda: jaxremat.apply(lambda p, x: x * 2, {"w": "hello"}, X),
         jaxremat.InvalidArgumentError, r"params\['w'\] is a str"),
    Case("non-array-batch", lambda: jaxremat.apply(mlp()[0].apply, mlp()[1], [1.0, 2.0]),
         jaxremat.InvalidArgumentError, r"batch\[0\] is a float"),
    Case("batch-on-an-explicit-mesh",  # a docs check: a bare AssertionError from emit
         lambda: jaxremat.apply(mlp()[0].apply, mlp()[1], jax.device_put(
             X, jax.sharding.NamedSharding(jax.make_mesh((1,), ("data",)),
                                           jax.sharding.PartitionSpec("data")))),
         jaxremat.InvalidArgumentError, r"batch is sharded over an Explicit axis of its mesh "
         r"\(jax.make_mesh's default axis type\).*AxisType.Auto"),
    Case("apply-under-jit",
         lambda: jax.jit(lambda p: jaxremat.apply(mlp()[0].apply, p, X).plan.checkpoints)(mlp()[1]),
         jaxremat.InvalidArgumentError, r"is a tracer: jaxremat.apply traces the model itself"),
    Case("model-not-callable", lambda: jaxremat.apply("model.apply", {}, X),
         jaxremat.InvalidArgumentError, "model_fn must be callable"),
    Case("model-is-a-module", lambda: jaxremat.apply(mlp()[0], mlp()[1], X),
         jaxremat.InvalidArgumentError,
         r"model_fn is a Flax module \(\w+\), not its apply function: call "
         r"jaxremat.apply\(model.apply, params, batch\)"),
    Case("fit-model-is-a-module", lambda: jaxremat.fit(mlp()[0], mlp()[1], X, 0.5),
         jaxremat.InvalidArgumentError,
         r"model_fn is a Flax module \(\w+\), not its apply function: call "
         r"jaxremat.fit\(model.apply, params, batch, memory_budget\)"),
    Case("model-is-an-nnx-module",
         lambda: jaxremat.apply(nnx.Linear(4, 8, rngs=nnx.Rngs(0)), {}, X),
         jaxremat.InvalidArgumentError, r"model_fn is an nnx module \(Linear\).*apply_nnx"),
    Case("model-is-an-nnx-method",
         lambda: jaxremat.apply(nnx.Linear(4, 8, rngs=nnx.Rngs(0)).__call__, X),
         jaxremat.InvalidArgumentError,
         r"model_fn is a method of an nnx module \(Linear.__call__\).*apply_nnx\(model, batch\)"),
    Case("nnx-model-is-a-linen-apply", lambda: jaxremat.apply_nnx(mlp()[0].apply, X),
         jaxremat.InvalidArgumentError,
         r"model must be a flax.nnx.Module, got method\. For a Flax linen module use "
         r"jaxremat.apply\(model.apply, params, batch\)"),
    Case("nnx-module-and-batch-alone",  # as apply_nnx takes them: one argument short
         lambda: jaxremat.fit(nnx.Linear(4, 8, rngs=nnx.Rngs(0)), X, 0.5),
         jaxremat.InvalidArgumentError, r"model_fn is an nnx module \(Linear\).*fit_nnx"),
    Case("apply-flag-positional", lambda: jaxremat.apply(mlp()[0].apply, mlp()[1], X, True),
         jaxremat.InvalidArgumentError,
         r"apply\(\) takes 3 positional arguments \(model_fn, params, batch\), got 4: True "
         r"after them\. The model's other arguments go by keyword.*"
         r"apply\(model\.apply, params, x, train=True\)"),
    Case("fit-second-input-positional",
         lambda: jaxremat.fit(mlp()[0].apply, mlp()[1], X, 0.5, X[:, 0]),
         jaxremat.InvalidArgumentError,
         r"fit\(\) takes 4 positional arguments \(model_fn, params, batch, memory_budget\), "
         r"got 5: a float32\[2\] array after them.*second input as tokens=tokens"),
    Case("apply-without-batch", lambda: jaxremat.apply(mlp()[0].apply, mlp()[1]),
         jaxremat.InvalidArgumentError, r"apply\(model_fn, params, batch\) was called without batch"),
    Case("apply-given-memory-budget", lambda: apply_mlp(memory_budget=0.5),
         jaxremat.InvalidArgumentError, r"apply\(\) got memory_budget=0\.5, which would be "
         r"passed to the model.*jaxremat\.fit's budget.*apply's is budget_bytes="),
    Case("fit-given-budget-bytes",
         lambda: jaxremat.fit(mlp()[0].apply, mlp()[1], X, 0.5, budget_bytes=10**6),
         jaxremat.InvalidArgumentError, r"fit\(\) got budget_bytes=1000000.*jaxremat\.apply's "
         r"budget; fit's is memory_budget, its fourth argument"),
    Case("fit-given-budget-bytes-alone",  # a user's trial: it said memory_budget was missing
         lambda: jaxremat.fit(mlp()[0].apply, mlp()[1], X, budget_bytes=2**25),
         jaxremat.InvalidArgumentError, r"fit\(\) got budget_bytes=33554432.*fit's is "
         r"memory_budget"),
    Case("fit-nnx-without-budget", lambda: jaxremat.fit_nnx(NnxMLP(nnx.Rngs(0)), X),
         jaxremat.InvalidArgumentError,
         r"fit_nnx\(model, batch, memory_budget\) was called without memory_budget"),
    Case("params-batch-swapped", lambda: jaxremat.apply(mlp()[0].apply, X, mlp()[1]),
         jaxremat.InvalidArgumentError,
         r"batch is a dict with a 'params' entry .* and params is a float32\[2, 4\] array: "
         r"params and batch look swapped.*jaxremat\.apply\(model\.apply, variables, x\)"),
    Case("plan-not-a-plan", lambda: apply_mlp(plan=(1, 2)),
         jaxremat.InvalidArgumentError, r"plan must be a jaxremat.Plan, got tuple"),
    Case("layer-depth-negative", lambda: apply_mlp(layer_depth=-1),
         jaxremat.InvalidArgumentError,
         r"layer_depth must be None, an int >= 0.* or 'search'.*got -1"),
    Case("layer-depth-not-int", lambda: apply_mlp(layer_depth="1"),
         jaxremat.InvalidArgumentError, r"layer_depth must be None, an int >= 0.*got '1'"),
    Case("layer-depth-search-with-budget",
         lambda: apply_mlp(layer_depth="search", budget_bytes=10**7),
         jaxremat.InvalidArgumentError,
         r"layer_depth='search' compiles the optimal plan.*does not take budget_bytes="),
    Case("fit-layer-depth-search",
         lambda: jaxremat.fit(mlp()[0].apply, mlp()[1], X, 0.5, layer_depth="search"),
         jaxremat.InvalidArgumentError, r"layer_depth must be None, an int >= 0.*got 'search'"),
    Case("profile-unknown", lambda: apply_mlp(profile="xla"),
         jaxremat.InvalidArgumentError, r"profile must be one of \('jaxpr', 'compiled'\).*'xla'"),
    Case("solve-not-a-chain", lambda: jaxremat.solve([4, 4, 4]),
         jaxremat.InvalidArgumentError, r"solve expects a jaxremat.Chain, got list"),
    Case("target-without-plugin", measure_for_h100_without_the_plugin,
         jaxremat.TargetUnavailableError, r"needs JAX's CUDA plugin.*pip install"),
    Case("bad-target-config",
         lambda: jaxremat.measure(lambda w, x: jnp.sum(x * w), jnp.ones(3), X,
                                  target='platform_name: "CUDA"\n'),
         jaxremat.InvalidArgumentError, r"threads_per_warp.*get_target\('h100'\)"),
    Case("apply-loss-fn-not-callable", lambda: apply_mlp(loss_fn="cross_entropy"),
         jaxremat.InvalidArgumentError, r"loss_fn must be a function of the model's output.*got str"),
    Case("apply-loss-fn-of-two-arguments", lambda: apply_mlp(loss_fn=lambda logits, labels: 0.0),
         jaxremat.InvalidArgumentError,
         r"called with the model's output alone, but \(logits, labels\) does not take one "
         r"argument; close over the labels"),
    Case("apply-loss-fn-not-scalar",
         lambda: apply_mlp(loss_fn=lambda out: out * 2, verify=False),
         jaxremat.InvalidArgumentError, r"loss_fn must return a float scalar.*\(2, 8\)"),
    Case("apply-loss-fn-with-aux",
         lambda: apply_mlp(loss_fn=lambda out: (out.mean(), out), verify=False),
         jaxremat.InvalidArgumentError, r"got a tuple of 2 whose first is a scalar.*"
         r"pass lambda out: loss_fn\(out\)\[0\]"),
    Case("apply-loss-fn-raises-on-the-output",
         lambda: apply_mlp(loss_fn=lambda out: out["logits"].mean(), verify=False),
         jaxremat.InvalidArgumentError,
         r"loss_fn raised (TypeError|IndexError).* on the model's output, "
         r"float32\[2, 8\]\. loss_fn takes the output as the model returns it"),
    Case("apply-loss-fn-of-the-state-with-mutable", loss_of_the_state_with_mutable,
         jaxremat.InvalidArgumentError,
         r"loss_fn raised .* float32\[2, 4\]\. loss_fn takes with mutable= the output "
         r"without its updated collections \(the logits alone"),
    Case("measure-non-scalar-loss", lambda: jaxremat.measure(mlp()[0].apply, mlp()[1], X),
         jaxremat.InvalidArgumentError, r"loss_fn must return a float scalar.*\(2, 8\)"),
    Case("measure-loss-with-aux",
         lambda: jaxremat.measure(lambda p, x: (mlp()[0].apply(p, x).mean(), {"n": 1}),
                                  mlp()[1], X),
         jaxremat.InvalidArgumentError, r"got a tuple of 2 whose first is a scalar.*has_aux=True"
         r".*loss_fn\(params, batch\)\[0\]"),
    # Models jaxremat cannot checkpoint.
    Case("no-layers", lambda: jaxremat.apply(lambda p, x: x, {"w": jnp.ones(3)}, jnp.ones(3)),
         jaxremat.EmptyModelError, "no layers"),
    Case("no-parameters", lambda: jaxremat.apply(lambda p, x: jnp.tanh(x) * 2.0, {}, X),
         jaxremat.EmptyModelError, r"parameters hold no float array \(it is empty\)"),
    Case("fit-no-float-parameters",
         lambda: jaxremat.fit(lambda p, x: jnp.tanh(x) * p["n"], {"n": jnp.int32(2)}, X, 0.5),
         jaxremat.EmptyModelError, r"leaves are of dtypes \['int32'\]\): the training step "
         "differentiates nothing"),
    Case("integer-outputs",
         lambda: jaxremat.apply(lambda p, x: jnp.argmax(mlp()[0].apply(p, x), -1), mlp()[1], X),
         jaxremat.UnsupportedModelError, r"outputs are all of non-float dtypes \['int32'\]"),
    Case("side-effects", lambda: apply_to(WithPrint()),
         jaxremat.UnsupportedModelError, "has side effects"),
    Case("host-callback", lambda: apply_to(WithCallback()),
         jaxremat.UnsupportedModelError, r"'pure_callback' in WithCallback.*host callback"),
    Case("gradient-inside-model",
         lambda: jaxremat.apply(jax.grad(lambda p, x: mlp()[0].apply(p, x).sum()), mlp()[1], X),
         jaxremat.UnsupportedModelError, "computes a gradient itself"),
    Case("graph-with-chain-method", lambda: apply_to(SkipAcrossLayers(), method="multilevel"),
         jaxremat.NotAChainError, r"plans such a model as a graph.*method='multilevel' is not"),
    Case("scan-carry-not-activation", lambda: jaxremat.apply(scan_carrying_a_count, STACK, X[:, :4]),
         jaxremat.UnsupportedScanError, "carry does not depend on the batch"),
    Case("scan-segment-too-long", lambda: jaxremat.apply(scan_stack, STACK, X[:, :4], scan_segment=5),
         jaxremat.UnsupportedScanError, "5 is longer than the 4 iterations.*from 1 to 4"),
    # Methods and budgets.
    Case("unknown-method", lambda: apply_mlp(method="fastest"),
         jaxremat.UnknownMethodError, r"unknown method 'fastest'.*'optimal'"),
    Case("budget-below-inputs", lambda: apply_mlp(budget_bytes=1000),
         jaxremat.InfeasibleBudgetError,
         r"budget_bytes=1000 \(1000 B\) is below the \d+ bytes \(\d+\.\d\d KiB\) that the "
         r"parameters, the batch and the parameter gradients hold in every training step"),
    Case("budget-below-least", lambda: apply_mlp(budget_bytes=BELOW_LEAST),
         jaxremat.InfeasibleBudgetError, r"below the least footprint XLA compiled for the \d+ plans jaxremat tried, the "
         r"least-peak plan among them: \d+ bytes \(\d+\.\d\d KiB\)"),
    Case("budget-below-least-scanned",
         lambda: jaxremat.apply(scan_stack, STACK, X[:, :4],
                                budget_bytes=held_bytes(STACK, X[:, :4]) + 8),
         jaxremat.InfeasibleBudgetError, r"least-peak plan among them: \d+ bytes \([^)]*\)\. "
         r"Raise the budget or shrink the batch\.$"),  # not layer_depth='search': no use here
    Case("budget-negative", lambda: apply_mlp(budget_bytes=-5),
         jaxremat.InvalidBudgetError, "non-negative number of bytes, got -5"),
    Case("budget-a-share", lambda: apply_mlp(budget_bytes=0.5),
         jaxremat.InvalidBudgetError, r"budget_bytes is a number of bytes.*got 0.5.*"
         r"jaxremat.fit\(\.\.\., memory_budget=0.5\)"),
    Case("budget-not-a-number", lambda: apply_mlp(budget_bytes="1GB"),
         jaxremat.InvalidArgumentError, r"budget_bytes must be a number of bytes.*'1GB'"),
    Case("budget-nan", lambda: apply_mlp(budget_bytes=float("nan")),
         jaxremat.InvalidBudgetError, r"number of bytes or \+inf, got nan"),
    Case("budget-with-other-method", lambda: apply_mlp(budget_bytes=10**6, method="sqrt"),
         jaxremat.InvalidBudgetError, "cannot be combined with method='sqrt'"),
    Case("solve-budget-missing", lambda: jaxremat.solve(CHAIN, "budget"),
         jaxremat.InvalidBudgetError, "method='budget' needs budget_bytes"),
    Case("solve-budget-not-taken", lambda: jaxremat.solve(CHAIN, "optimal", budget_bytes=10),
         jaxremat.InvalidBudgetError, "method='optimal' takes no budget"),
    Case("solve-budget-below-least", lambda: jaxremat.solve(CHAIN, "budget", budget_bytes=5),
         jaxremat.InfeasibleBudgetError, r"below the least peak any plan reaches, \d+ bytes"),
    Case("chain-too-long", lambda: jaxremat.solve(jaxremat.Chain([1] * 31, [1] * 30), "brute"),
         jaxremat.ChainTooLongError, "accepts at most 20 layers; this chain has 30"),
    Case("fit-budget-not-a-number", lambda: jaxremat.fit(mlp()[0].apply, mlp()[1], X, "half"),
         jaxremat.InvalidArgumentError, r"memory_budget must be a share of the activations.*'half'"),
    Case("fit-budget-not-positive", lambda: jaxremat.fit(mlp()[0].apply, mlp()[1], X, 0),
         jaxremat.InvalidBudgetError, r"positive number of bytes, got 0"),
    Case("fit-budget-below-inputs", lambda: jaxremat.fit(mlp()[0].apply, mlp()[1], X, 50),
         jaxremat.InfeasibleBudgetError,
         r"memory_budget=50 \(50 B\) is below the \d+ bytes .* A float in \(0, 1\] is a share "
         r"of the activations instead"),
    Case("fit-budget-float-bytes", lambda: jaxremat.fit(mlp()[0].apply, mlp()[1], X, 1.5),
         jaxremat.InfeasibleBudgetError,
         r"memory_budget=1.5, read as 1 byte \(1 B\) is below .* A float in \(0, 1\] is a "
         r"share"),
    Case("fit-budget-below-least", lambda: jaxremat.fit(mlp()[0].apply, mlp()[1], X, BELOW_LEAST),
         jaxremat.InfeasibleBudgetError, rf"no plan fits the step in {BELOW_LEAST} bytes .* the least "
         r"footprint found is \d+ bytes"),
    Case("fit-graph-below-least", lambda: jaxremat.fit(
        SkipAcrossLayers().apply, SkipAcrossLayers().init(jax.random.key(0), X), X, 0.01,
        verify=False),
         jaxremat.InfeasibleBudgetError, r"no plan fits the step in \d+ bytes .* the least "
         r"footprint found is \d+ bytes .*predicted"),
    Case("fit-time-steps-without-verify",
         lambda: jaxremat.fit(mlp()[0].apply, mlp()[1], X, 0.5, verify=False, time_steps=True),
         jaxremat.InvalidArgumentError, r"time_steps=True runs the fitting plans on this "
         r"machine, but verify=False compiles nothing"),
    # Plans and chains.
    Case("checkpoint-out-of-range", lambda: apply_mlp(plan=jaxremat.Plan((5,))),
         jaxremat.InvalidPlanError, r"out of range for a chain of 5 layers; valid indices are 1..4"),
    Case("checkpoints-unsorted", lambda: jaxremat.Plan((3, 1)),
         jaxremat.InvalidPlanError, r"strictly increasing, got \(3, 1\)"),
    Case("plan-for-longer-chain", lambda: jaxremat.peak_bytes(CHAIN, jaxremat.Plan((2, 7))),
         jaxremat.InvalidPlanError, r"indices \[7\] are out of range for a chain of 3 layers"),
    Case("inner-outside-segment",
         lambda: jaxremat.simulate_peak_bytes(CHAIN, jaxremat.Plan((1,), inner=((1, jaxremat.Plan((1,))),))),
         jaxremat.InvalidPlanError, r"inner checkpoints \[1\] lie outside the segment \(1, 3\]"),
    Case("nested-plan-in-peak-bytes",
         lambda: jaxremat.peak_bytes(CHAIN, jaxremat.Plan((1,), inner=((1, jaxremat.Plan((2,))),))),
         jaxremat.InvalidPlanError, "simulate_peak_bytes"),
    Case("chain-lengths-disagree", lambda: jaxremat.Chain([1, 2], [1, 1]),
         jaxremat.InvalidChainError, "act_bytes has 2 entries, expected 3"),
    Case("chain-negative-bytes", lambda: jaxremat.Chain([1, -2, 1], [1, 1]),
         jaxremat.InvalidChainError, "act_bytes must be non-negative"),
    # The drop-in called with other inputs.
    Case("drop-in-batch-shape", lambda: call_drop_in(batch=jnp.ones((2, 5))),
         jaxremat.InputMismatchError,
         r"model fails on a batch of float32 \(2, 5\) \(the plan was made for float32 \(2, 4\)\)"),
    Case("drop-in-dict-batch-leaf", dict_batch_drop_in, jaxremat.InputMismatchError,
         r"model fails on a batch whose \['x'\] is float32 \(2, 5\), where the plan has "
         r"float32 \(2, 4\)"),
    Case("drop-in-batch-missing", lambda: mlp()[2].fn(X), jaxremat.InvalidArgumentError,
         r"called as .*r\.fn\(params, batch, \*\*kwargs\).*got one positional argument.*"
         r"apply_nnx"),
    Case("drop-in-positional-extras", lambda: mlp()[2].fn(mlp()[1], X, True),
         jaxremat.InvalidArgumentError, r"by keyword.*got 1 more positional argument"),
    Case("nnx-drop-in-batch-missing", lambda: nnx_drop_in()[1].fn(X),
         jaxremat.InvalidArgumentError,
         r"the drop-in jaxremat\.apply_nnx returns is called as r\.fn\(model, batch, "
         r"\*\*kwargs\): the NnxMLP module .* then the batch; got one positional argument"),
    Case("nnx-drop-in-swapped", lambda: nnx_drop_in()[1].fn(X, nnx_drop_in()[0]),
         jaxremat.InvalidArgumentError,
         r"called as r\.fn\(model, batch, \*\*kwargs\).*got \w+, then NnxMLP"),
    Case("drop-in-batch-structure", lambda: call_drop_in(batch={"x": X}),
         jaxremat.InputMismatchError, r"batch has structure .*'x'.*but the plan was made for"),
    Case("drop-in-params-unwrapped", lambda: call_drop_in(lambda p: p["params"]),
         jaxremat.InputMismatchError,
         r"params do not have the structure the plan was made for: 6 leaves missing, e\.g\. "
         r"params\['params'\]\['layers_0'\]\['bias'\].*6 leaves not in the plan, e\.g\. "
         r"params\['layers_0'\]\['bias'\]"),
    Case("drop-in-params-shape",
         lambda: call_drop_in(lambda p: mlp()[0].init(jax.random.key(0), jnp.ones((2, 5)))),
         jaxremat.InputMismatchError,
         r"params do not match the shapes.*params\['params'\]\['layers_0'\]\['kernel'\]: "
         r"shape \(5, 8\) \(expected \(4, 8\)\).*Plan again"),
    Case("drop-in-other-layers", other_layers_on_bigger_batch,
         jaxremat.InputMismatchError, r"with these inputs the model has layers .*plan again with these inputs"),
    Case("drop-in-other-keyword-arguments", planned_for_evaluation_called_for_training,
         jaxremat.InputMismatchError,
         r"made with no keyword arguments, this call has rngs=\{'dropout': key<fry>\[\]\}, "
         r"train=True; plan with those of the training step"),
    Case("drop-in-flag-traced-by-jit", flag_traced_by_jit, jaxremat.InputMismatchError,
         r"fails when train= is an array .*jax\.jit traced it\. Mark it static "
         r"\(jaxremat\.jit\(f, static_argnames=\('train',\)\)\) or close over it"),
    # Reports.
    Case("plot-unknown-method", lambda: mlp()[2].plot("unused.png", compare=("fast",)),
         jaxremat.UnknownMethodError, "unknown method 'fast'"),
    Case("plot-without-matplotlib", without_matplotlib,
         ImportError, r'pip install "jaxremat\[plot\]"'),
]


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_bad_input_is_rejected(case, tmp_path, monkeypatch):
  monkeypatch.chdir(tmp_path)  # nothing may be written, but never into the repository
  with pytest.raises(case.error, match=case.phrase) as info:
    case.call()
  err = info.value
  if case.error is not ImportError:
    assert isinstance(err, jaxremat.JaxrematError)
  if isinstance(err, jaxremat.InfeasibleBudgetError):  # the message states the least figure
    assert f"{err.min_feasible_bytes} bytes" in str(err)
    assert err.min_feasible_bytes > err.budget_bytes
  assert list(tmp_path.iterdir()) == []


def test_the_table_in_docs_lists_every_case_with_its_class():
  rows = re.findall(r"^\| `([a-z0-9-]+)` \|[^|]*\|[^|]*\| `(\w+)` \|", ERRORS_MD.read_text(), re.M)
  assert [row_id for row_id, _ in rows] == [c.id for c in CASES]
  assert [name for _, name in rows] == [c.error.__name__ for c in CASES]


def test_budget_error_carries_the_least_budget_that_works():
  model, params, _ = mlp()
  with pytest.raises(jaxremat.InfeasibleBudgetError) as info:
    apply_mlp(budget_bytes=BELOW_LEAST)
  least = info.value.min_feasible_bytes  # XLA-measured: budgets verify by default
  r = jaxremat.apply(model.apply, params, X, budget_bytes=least)
  assert r.verified[r.plan.checkpoints] <= least
  with pytest.raises(jaxremat.InfeasibleBudgetError, match="by jaxremat's prediction") as info:
    apply_mlp(budget_bytes=BELOW_LEAST, verify=False)
  r = jaxremat.apply(model.apply, params, X, budget_bytes=info.value.min_feasible_bytes,
                     verify=False)
  assert r.predicted_total_bytes <= info.value.min_feasible_bytes


def test_argument_errors_are_also_type_errors():
  """Callers that caught TypeError before InvalidArgumentError existed still do."""
  with pytest.raises(TypeError):
    jaxremat.solve("chain")


def test_budget_below_what_the_inputs_hold_is_rejected_before_compiling():
  """The least figure is the bytes of params, batch and gradients, and nothing compiles."""
  model, params, _ = mlp()
  with mock.patch("jaxremat._api.checks.trace", side_effect=AssertionError("traced")):
    with pytest.raises(jaxremat.InfeasibleBudgetError) as info:
      apply_mlp(budget_bytes=1000)
  assert info.value.min_feasible_bytes == held_bytes(params, X)
  with mock.patch("jaxremat._api.checks.trace", side_effect=AssertionError("traced")):
    with pytest.raises(jaxremat.InfeasibleBudgetError) as info:
      jaxremat.fit(model.apply, params, X, 50)
  assert info.value.min_feasible_bytes == held_bytes(params, X)


class DropoutMLP(nn.Module):
  @nn.compact
  def __call__(self, x, train: bool):
    x = nn.relu(nn.Dense(8)(x))
    x = nn.Dropout(0.5, deterministic=not train)(x)
    return nn.Dense(8)(x)


def test_drop_in_raises_the_models_own_error_for_other_keyword_arguments():
  """Called without the dropout rng it was planned with, the drop-in raises Flax's own
  error (its class kept, for callers that catch it), with a note saying what differed."""
  model = DropoutMLP()
  params = model.init(jax.random.key(0), X, train=False)
  r = jaxremat.apply(model.apply, params, X, train=True, rngs={"dropout": jax.random.key(1)},
                     verify=False)
  with pytest.raises(flax.errors.InvalidRngError) as info:
    r.fn(params, X, train=True)
  notes = info.value.__notes__  # the call's, not apply's note on how it calls the model
  assert not any(n.startswith("jaxremat: the model raised this when traced as") for n in notes)
  (note,) = [n for n in notes if n.startswith("jaxremat:")]
  assert "other keyword arguments than the plan was made for" in note
  assert "made with rngs={'dropout': key<fry>[]}, train=True, this call has train=True." in note


class _DropoutBlocks(nn.Module):
  """Two blocks with dropout inside each: the same layers in training and evaluation."""

  @nn.compact
  def __call__(self, x, train: bool):
    for _ in range(2):
      x = DropoutMLP()(x, train)
    return x


def test_drop_in_warns_when_its_plan_runs_for_other_keyword_arguments():
  """A user's trial planned in evaluation mode (the model's default) and trained through
  the drop-in with dropout: the same layers, so the plan runs, but its figures were an
  evaluation's (14.99 MiB reported, 17.02 for the training step)."""
  model = _DropoutBlocks()
  params = model.init(jax.random.key(0), X, train=False)
  with warnings.catch_warnings():  # the blocks are too small to save much: not the point
    warnings.simplefilter("ignore", jaxremat.CoarseLayersWarning)
    r = jaxremat.apply(model.apply, params, X, train=False, layer_depth=1, verify=False)
  rngs = {"dropout": jax.random.key(1)}
  with pytest.warns(jaxremat.PlanReusedWarning, match=(
      r"called with rngs=\{'dropout': key<fry>\[\]\}, train=True, but the plan was made "
      "with train=False")):
    got = jax.grad(lambda p: r.fn(p, X, train=True, rngs=rngs).sum())(params)
  want = jax.grad(lambda p: model.apply(p, X, train=True, rngs=rngs).sum())(params)
  for a, b in zip(jax.tree_util.tree_leaves(got), jax.tree_util.tree_leaves(want)):
    np.testing.assert_allclose(a, b, rtol=1e-6)


def test_drop_in_runs_keyword_arrays_of_another_dtype_without_a_warning():
  """A user's diffusion model planned with an int32 timestep and called with a float one:
  as for a batch of another dtype, the plan runs and nothing warns (the warning is for
  other flags: an evaluation's plan running a training step)."""
  model, params, _ = mlp()

  def model_fn(p, x, t):
    return model.apply(p, x) * t[:, None]

  t = jnp.arange(X.shape[0], dtype=jnp.int32)
  r = jaxremat.apply(model_fn, params, X, t=t, verify=False)
  tf = t.astype(jnp.float32) + 0.5
  with warnings.catch_warnings():
    warnings.simplefilter("error")
    got = jax.grad(lambda p: r.fn(p, X, t=tf).sum())(params)
  want = jax.grad(lambda p: model_fn(p, X, tf).sum())(params)
  for a, b in zip(jax.tree_util.tree_leaves(got), jax.tree_util.tree_leaves(want)):
    np.testing.assert_allclose(a, b, rtol=1e-6)


class NnxNormed(nnx.Module):
  def __init__(self, rngs: nnx.Rngs):
    self.a, self.norm = nnx.Linear(4, 8, rngs=rngs), nnx.BatchNorm(8, rngs=rngs)
    self.b = nnx.Linear(8, 4, rngs=rngs)

  def __call__(self, x):
    return self.b(nnx.relu(self.norm(self.a(x))))


def test_nnx_drop_in_says_the_modules_mode_changed():
  """A user's trial planned an nnx ResNet in training mode and called the drop-in after
  model.eval(): the warning said "called with no keyword arguments, but the plan was made
  with no keyword arguments"."""
  model = NnxNormed(nnx.Rngs(0))
  r = jaxremat.apply_nnx(model, X, verify=False)
  model.eval()
  with pytest.warns(jaxremat.PlanReusedWarning,
                    match=r"the module's static attributes differ .*model\.eval\(\)"):
    r.fn(model, X)


def test_drop_in_keeps_the_notes_of_the_models_own_error():
  """The drop-in's note for other keyword arguments replaces apply's note on how it calls
  the model, and no other note the error carries."""
  model, params, _ = mlp()

  def model_fn(p, x, scale):
    if scale != 1:
      err = ValueError("scale must be 1")
      err.add_note("the model's own note")
      raise err
    return model.apply(p, x) * scale

  r = jaxremat.apply(model_fn, params, X, scale=1, verify=False)
  with pytest.raises(ValueError) as info:
    r.fn(params, X, scale=2)
  notes = info.value.__notes__
  assert "the model's own note" in notes
  assert not any(n.startswith("jaxremat: the model raised this when traced as") for n in notes)
  assert any("other keyword arguments than the plan was made for" in n for n in notes)


def test_drop_in_takes_params_cast_to_bfloat16():
  """Mixed precision: the plan made with float32 params runs params cast in the loss."""
  model, params, r = mlp()
  cast = jax.tree.map(lambda a: a.astype(jnp.bfloat16), params)
  want = jax.grad(lambda p: jnp.sum(model.apply(p, X).astype(jnp.float32) ** 2))(cast)
  got = jax.grad(lambda p: jnp.sum(r.fn(p, X).astype(jnp.float32) ** 2))(cast)
  for a, b in zip(jax.tree.leaves(want), jax.tree.leaves(got)):
    assert a.dtype == b.dtype == jnp.bfloat16
    np.testing.assert_allclose(np.asarray(a, np.float32), np.asarray(b, np.float32), rtol=1e-2)


class MeanHead(nn.Module):
  """Dense layers, then a mean outside any module: a layer named by its primitives."""

  @nn.compact
  def __call__(self, x):
    x = nn.relu(nn.Dense(8)(x))
    x = nn.relu(nn.Dense(8)(x))
    return nn.Dense(4)(x.mean(0, keepdims=True))


def test_drop_in_takes_a_bfloat16_batch_and_params_through_unnamed_layers():
  """Cast to bfloat16, the mean's layer gains a convert in its name; it is the same layer."""
  model = MeanHead()
  params = model.init(jax.random.key(0), X)
  r = jaxremat.apply(model.apply, params, X, verify=False)
  cast = jax.tree.map(lambda a: a.astype(jnp.bfloat16), (params, X))
  want = jax.grad(lambda p: jnp.sum(model.apply(p, cast[1]).astype(jnp.float32) ** 2))(cast[0])
  got = jax.grad(lambda p: jnp.sum(r.fn(p, cast[1]).astype(jnp.float32) ** 2))(cast[0])
  for a, b in zip(jax.tree.leaves(want), jax.tree.leaves(got)):
    np.testing.assert_allclose(np.asarray(a, np.float32), np.asarray(b, np.float32), rtol=1e-2)


@pytest.mark.parametrize("option", [{"plan": jaxremat.Plan((1,))}, {"method": "sqrt"},
                                    {"verify": False}])
def test_layer_depth_search_names_the_option_it_does_not_take(option):
  given = next(iter(option))
  with pytest.raises(jaxremat.InvalidArgumentError, match=f"does not take {given}"):
    apply_mlp(layer_depth="search", **option)


@pytest.mark.parametrize("keyword, option", [("budget", "budget_bytes"), ("loss", "loss_fn"),
                                             ("wrt", "a keyword array")])
def test_a_misspelled_option_the_model_refuses_is_named(keyword, option):
  """A user's trial: budget=, loss= and wrt= went on to the model, whose TypeError said
  nothing of jaxremat's options; its note names the option meant."""
  model, params, _ = mlp()
  with pytest.raises(TypeError, match=f"unexpected keyword argument '{keyword}'") as info:
    jaxremat.apply(model.apply, params, X, **{keyword: 1})
  notes = "\n".join(getattr(info.value, "__notes__", []))
  assert f"{keyword}= " in notes and option in notes
