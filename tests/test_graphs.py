"""Graph chains (skip tensors): model G against its event oracle, the exact DP against brute
force, and the U-Net / DenseNet zoo end to end (gradients, XLA's footprint)."""

import itertools
import os
import random

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jaxremat
from jaxremat import zoo_graphs
from jaxremat._errors import InvalidChainError, NotAChainError, UnknownMethodError
from jaxremat._api.dropin import DropIn, input_key
from jaxremat._api.fit_graph import module_runs, run_label
from jaxremat._backends.policy_options import LayerOptions
from jaxremat._backends.roofline import roofline_for
from jaxremat._jaxpr.trace import trace
from jaxremat._model.graph import GraphChain, graph_peak_bytes, graph_recompute_flops
from jaxremat._model.policy_plan import DOTS, KEEP, NAMES, RECOMPUTE, Group, Option, PolicyPlan
from jaxremat.solvers._graph import solve_graph
import realworld_models as rm
from graph_oracles import random_graph, simulate_graph_peak
from oracles import all_plans, literal_peak_of, random_chain

# ---------------------------------------------------------------- model G and its solver


def test_skip_tensor_crossing_several_kept_cuts_counts_once():
  # x0 (batch) -> 1 -> 2 -> 3 -> 4; value s (made by unit 1) is read again by unit 4.
  g = GraphChain(value_bytes=[1, 10, 2, 2, 2, 1], defined=[0, 1, 1, 2, 3, 4],
                 last_use=[1, 4, 2, 3, 4, 5], res_bytes=[0, 0, 0, 0],
                 value_cot_bytes=[0, 0, 0, 0, 0, 0])
  assert g.crossing(2) == {1, 3} and g.crossing(3) == {1, 4}
  # Kept cuts 2 and 3 both hold s (10 bytes): once, so 1 + 10 + 2 + 2 at the last segment.
  assert graph_peak_bytes(g, jaxremat.Plan((2, 3))) == 15
  assert simulate_graph_peak(g, (2, 3)) == 15


@pytest.mark.parametrize("seed", range(150))
def test_model_g_formula_equals_event_oracle(seed):
  rng = random.Random(seed)
  g = random_graph(rng, rng.randint(1, 7))
  for cps in all_plans(g.n):
    assert graph_peak_bytes(g, jaxremat.Plan(cps)) == simulate_graph_peak(g, cps), cps


@pytest.mark.parametrize("seed", range(150))
def test_dp_is_the_brute_force_optimum_with_least_recompute(seed):
  rng = random.Random(seed)
  g = random_graph(rng, rng.randint(1, 9))
  plan = solve_graph(g, "optimal")
  best = min(simulate_graph_peak(g, cps) for cps in all_plans(g.n))
  assert simulate_graph_peak(g, plan.checkpoints) == best
  least = min(graph_recompute_flops(g, jaxremat.Plan(cps)) for cps in all_plans(g.n)
              if simulate_graph_peak(g, cps) == best)
  assert graph_recompute_flops(g, plan) == least
  brute = solve_graph(g, "brute")
  assert (graph_peak_bytes(g, brute), graph_recompute_flops(g, brute)) == (best, least)


@pytest.mark.parametrize("seed", range(60))
def test_on_a_chain_model_g_is_model_r(seed):
  rng = random.Random(seed)
  chain = random_chain(rng, rng.randint(1, 8), refine=True)
  # model G sees a saved input as a whole value: e_i is 0 or all of x_{i-1}.
  e = [rng.choice((0, chain.act_bytes[i])) if chain.act_bytes[i] <= b else 0
       for i, b in enumerate(chain.res_bytes)]
  chain = jaxremat.Chain(chain.act_bytes, chain.res_bytes, cot_bytes=chain.cot_bytes,
                         input_res_bytes=e, workspace_bytes=chain.workspace_bytes, flops=chain.flops)
  g = GraphChain.from_chain(chain)
  for cps in all_plans(chain.n):
    assert graph_peak_bytes(g, jaxremat.Plan(cps)) == literal_peak_of(chain, cps)
  assert graph_peak_bytes(g, solve_graph(g)) == jaxremat.peak_bytes(chain, jaxremat.solve(chain))


def test_bad_graphs_and_methods_raise_clear_errors():
  with pytest.raises(InvalidChainError, match="defined < last_use"):
    GraphChain(value_bytes=[1], defined=[2], last_use=[2], res_bytes=[0, 0])
  with pytest.raises(InvalidChainError, match="neither makes nor reads"):
    GraphChain(value_bytes=[1, 1], defined=[0, 2], last_use=[1, 3], res_bytes=[0, 0],
               saved=[[1], []])
  g = random_graph(random.Random(0), 4)
  with pytest.raises(UnknownMethodError, match="not a chain"):
    solve_graph(g, "multilevel")


# ---------------------------------------------------------------- U-Net and DenseNet end to end

KEY = jax.random.key(0)
MODELS = {
    "unet": (zoo_graphs.UNet((4, 8, 16)), (2, 16, 16, 3)),
    "densenet": (zoo_graphs.DenseNet((3, 3), growth=4, stem=8), (2, 16, 16, 3)),
}


@pytest.fixture(scope="module", params=[pytest.param(m, marks=pytest.mark.xla) for m in sorted(MODELS)])
def zoo_model(request):
  model, shape = MODELS[request.param]
  x = jax.random.normal(jax.random.key(1), shape)
  return request.param, model, jax.jit(model.init)(KEY, x), x


def _loss(fn):
  return lambda p, x: jnp.mean(jnp.square(fn(p, x)))


def _assert_trees_close(want, got, tol=1e-5):
  assert jax.tree_util.tree_structure(want) == jax.tree_util.tree_structure(got)
  for (path, w), g in zip(jax.tree_util.tree_leaves_with_path(want), jax.tree_util.tree_leaves(got)):
    scale = max(1.0, float(np.max(np.abs(w))))
    np.testing.assert_allclose(g, w, atol=tol * scale, rtol=tol, err_msg=jax.tree_util.keystr(path))


def test_zoo_models_are_not_chains(zoo_model):
  _, model, params, x = zoo_model
  traced = trace(model.apply, params, x, {})
  assert traced.is_graph and "not a chain" in traced.not_a_chain
  made_by = {v: t for t, layer in enumerate(traced.layers) for e in layer.eqns for v in e.outvars}
  skips = [v for t, layer in enumerate(traced.layers) for v in layer.inputs if made_by[v] < t - 1]
  assert skips  # some layer reads a value made two or more layers earlier


@pytest.mark.parametrize("method", ["optimal", "every-layer"])
def test_gradients_equal_plain_gradients(zoo_model, method):
  _, model, params, x = zoo_model
  r = jaxremat.apply(model.apply, params, x, method=method)
  assert r.is_graph and r.chain.n >= 5
  if method == "every-layer":
    assert len(r.plan.checkpoints) == r.chain.n - 1
  want = jax.jit(jax.grad(_loss(model.apply)))(params, x)
  got = jax.jit(jax.grad(_loss(r.fn)))(params, x)
  _assert_trees_close(want, got)
  _assert_trees_close(model.apply(params, x), r.fn(params, x))
  if method != "optimal":
    return
  # Another batch size re-traces through the graph path; vmap over examples too.
  x2 = jnp.concatenate([x, x[:2]])
  _assert_trees_close(model.apply(params, x2), jax.jit(r.fn)(params, x2))
  per_example = jax.vmap(lambda e: r.fn(params, e[None])[0])(x[:2])
  _assert_trees_close(model.apply(params, x[:2]), per_example)


def test_report_lists_cuts_and_strategies(zoo_model):
  _, model, params, x = zoo_model
  r = jaxremat.apply(model.apply, params, x)
  text = r.report()
  assert "model-G peak" in text and "best-uniform" in text
  assert r.predicted_peak_bytes == graph_peak_bytes(r.chain, r.plan)
  header, *rows = r._planner.layer_table(r.plan)
  assert header[2] == "residuals" and header[-1] == "GFLOP" and len(rows) == r.chain.n
  last = max(r.plan.checkpoints, default=0)  # layers up to the last kept cut run again
  assert [row[5] != "saved" for row in rows] == [t <= last for t in range(1, r.chain.n + 1)]
  assert [float(row[-1]) for row in rows] == pytest.approx(
      [f / 1e9 for f in r.chain.flops], abs=6e-4)


def test_graph_budget_takes_the_least_recompute_within_it(zoo_model):
  """Model G's budget plan: within the budget, and no plan within it recomputes less."""
  _, model, params, x = zoo_model
  r = jaxremat.apply(model.apply, params, x, verify=False, profile="jaxpr")  # model G's optimum
  least = r.predicted_total_bytes
  none = r.predict_total_bytes(jaxremat.Plan(()))
  budget = (least + none) // 2
  fitted = jaxremat.apply(model.apply, params, x, budget_bytes=budget, verify=False,
                          profile="jaxpr")
  assert fitted.is_graph and fitted.predicted_total_bytes <= budget
  n = r.chain.n
  within = [jaxremat.Plan(c) for k in range(n) for c in itertools.combinations(range(1, n), k)
            if r.predict_total_bytes(jaxremat.Plan(c)) <= budget] if n <= 14 else []
  for plan in within:
    assert graph_recompute_flops(r.chain, plan) >= graph_recompute_flops(r.chain, fitted.plan)
  with pytest.raises(jaxremat.InfeasibleBudgetError):
    jaxremat.apply(model.apply, params, x, budget_bytes=least - 1, verify=False,
                   profile="jaxpr")


@pytest.mark.xla
def test_graph_budget_fits_the_replay_and_xla(zoo_model):
  """With the compiled profile (a graph's default) the budget plan is within the budget
  as the replay predicts it, and, fitted by default, as XLA compiles it."""
  _, model, params, x = zoo_model
  r = jaxremat.apply(model.apply, params, x, verify=False)
  assert r.profile == "compiled"
  with pytest.raises(jaxremat.InvalidPlanError, match="out of range"):
    r.predict_total_bytes(jaxremat.Plan((999,)))
  none = r.predict_total_bytes(jaxremat.Plan(()))
  budget = (r.predicted_total_bytes + none) // 2
  predicted = jaxremat.apply(model.apply, params, x, budget_bytes=budget, verify=False)
  assert predicted.predicted_total_bytes <= budget
  fitted = jaxremat.apply(model.apply, params, x, budget_bytes=budget)
  loss = lambda p, b: (fitted.fn(p, b) ** 2).mean()  # noqa: E731
  assert jaxremat.measure(loss, params, x).total_bytes <= budget
  with pytest.raises(jaxremat.InfeasibleBudgetError, match="least footprint"):
    jaxremat.apply(model.apply, params, x, budget_bytes=r.fixed_bytes, verify=False)


def test_options_graphs_do_not_support_raise_clear_errors(zoo_model):
  _, model, params, x = zoo_model
  with pytest.raises(NotAChainError, match="method='multilevel'"):
    jaxremat.apply(model.apply, params, x, method="multilevel")
  with pytest.raises(jaxremat.InvalidPlanError, match="out of range"):
    jaxremat.apply(model.apply, params, x, plan=jaxremat.Plan((999,)))


FOOTPRINT_MODELS = {
    "unet": (zoo_graphs.UNet((8, 16, 32)), (8, 32, 32, 3)),
    "densenet": (zoo_graphs.DenseNet((4, 4), growth=8, stem=16), (8, 32, 32, 3)),
}


# About (n - 1) * 4 + n whole-step compiles per model: the DenseNet one runs with
# JAXREMAT_SLOW_TESTS=1 (recorded: docs/graphs.md).
SLOW = pytest.mark.skipif(not os.environ.get("JAXREMAT_SLOW_TESTS"), reason="set JAXREMAT_SLOW_TESTS=1")


@pytest.mark.xla
@pytest.mark.parametrize("name", ["unet", pytest.param("densenet", marks=SLOW)])
def test_verified_plan_measures_below_no_remat_and_every_uniform_plan(name):
  """XLA's footprint of the chosen plan against no remat and every checkpoint-every-k plan.

  Model G ranks plans well at the top but XLA's CPU schedule is its own, so the plan is
  verified: what the default compiles (four plans at most), then every layer kept, model
  G's best uniform plan and optimum, and the cuts one away from the optimum (a shortlist
  of six with the chosen plan), and the least is kept.
  """
  model, shape = FOOTPRINT_MODELS[name]
  x = jax.random.normal(jax.random.key(1), shape)
  params = jax.jit(model.init)(KEY, x)
  r = jaxremat.apply(model.apply, params, x, verify=True)
  ours = jaxremat.measure(_loss(r.fn), params, x).total_bytes
  plain = jaxremat.measure(_loss(model.apply), params, x).total_bytes
  uniform = {}
  for k in range(1, r.chain.n):
    cuts = tuple(range(k, r.chain.n, k))
    emitted = jaxremat.apply(model.apply, params, x, plan=jaxremat.Plan(cuts), verify=False,
                             profile="jaxpr").fn  # the plan's drop-in: nothing compiled
    uniform[k] = r.verified.get(cuts) or jaxremat.measure(_loss(emitted), params, x).total_bytes
  best_k = min(uniform, key=uniform.get)
  figures = (f"{name}: none {plain / 2**20:.3f} MiB, best uniform (k={best_k}) "
             f"{uniform[best_k] / 2**20:.3f} MiB, ours {r.plan.checkpoints} {ours / 2**20:.3f} MiB")
  print(figures)
  assert ours < plain, figures
  assert ours <= uniform[best_k], figures
  assert len(r.verified) <= 4 + 5


# ---------------------------------------------------------------- jaxremat.fit on a graph

def test_policy_plans_on_a_graph_keep_gradients(zoo_model):
  """Per-layer options, a recomputed run of several layers and kept layers, emitted on a
  graph's layers (each group reading the values made before it that it uses)."""
  _, model, params, x = zoo_model
  traced = trace(model.apply, params, x, {})
  n = len(traced.layers)
  plans = [PolicyPlan(tuple(Group(i, i + 1, Option(kind)) for i in range(n)))
           for kind in (DOTS, RECOMPUTE)]
  plans.append(PolicyPlan((Group(0, 1, Option(KEEP)), Group(1, 4, Option(RECOMPUTE)),
                           Group(4, 5, Option(DOTS)), Group(5, n - 2, Option(RECOMPUTE)),
                           *(Group(i, i + 1, Option(KEEP)) for i in range(n - 2, n)))))
  want = jax.jit(jax.grad(_loss(model.apply)))(params, x)
  for plan in plans:
    fn = DropIn(model.apply, plan, None, traced, input_key(params, x, {}))
    _assert_trees_close(want, jax.jit(jax.grad(_loss(fn)))(params, x))


def test_fit_on_a_graph_fits_and_keeps_gradients(zoo_model):
  """fit plans a graph: XLA's footprint of its drop-in (measured here, apart from fit)
  is within the budget, and its gradients are the model's."""
  name, model, params, x = zoo_model
  fitted = jaxremat.fit(model.apply, params, x, 0.75)
  assert isinstance(fitted.chain, GraphChain)
  assert fitted.measured_total_bytes <= fitted.budget_bytes
  assert jaxremat.measure(_loss(fitted.fn), params, x).total_bytes <= fitted.budget_bytes
  assert fitted.timed and fitted.timed[0][1] == fitted.measured_total_bytes
  if name == "unet":  # the DP's plan fits (the DenseNet's of 0.26 MB miss by 7%)
    assert any("graph DP" in what for what, _, _ in fitted.timed)
  _assert_trees_close(jax.jit(jax.grad(_loss(model.apply)))(params, x),
                      jax.jit(jax.grad(_loss(fitted.fn)))(params, x))
  assert "frontier (XLA footprint" in fitted.report()


def test_fit_on_a_graph_predicted_and_infeasible(zoo_model):
  """verify=False: the graph DP's plan, predicted within the budget; a budget just above
  the fixed bytes says the least footprint XLA measured; a budget no remat fits returns
  no remat."""
  _, model, params, x = zoo_model
  fitted = jaxremat.fit(model.apply, params, x, 0.75, verify=False)
  assert fitted.measured_total_bytes is None and fitted.compiled == ()
  assert fitted.predicted_total_bytes <= fitted.budget_bytes
  with pytest.raises(jaxremat.InfeasibleBudgetError, match="least footprint found is") as err:
    jaxremat.fit(model.apply, params, x, fitted.fixed_bytes + 1)
  assert err.value.min_feasible_bytes > fitted.fixed_bytes + 1
  whole = jaxremat.fit(model.apply, params, x, 1.0)
  assert all(g.option.kind == KEEP for g in whole.plan.groups)
  assert whole.measured_total_bytes == whole.no_remat_bytes <= whole.budget_bytes


def test_module_runs_and_their_labels():
  """Runs of two or more consecutive layers inside one module, at every depth; a run's
  report label names its module."""
  names = ("embed", "(reshape)", "T/b0/LN", "T/b0/att/q", "T/b0/att/k", "T/b0/(add)",
           "T/b1/LN", "T/b1/att/q", "T/b1/(add)", "T/norm", "head")
  assert module_runs(names) == ((3, 5), (6, 9), (2, 6), (2, 10))
  assert run_label(names[2:6]) == "T/b0: LN .. (add) (4 layers)"
  assert run_label(names[6:10]) == "T: b1/LN .. norm (4 layers)"
  assert run_label(names[0:2]) == "embed .. (reshape)"


@pytest.mark.xla
def test_a_split_blocks_runs_under_one_policy():
  """A ViT split below its residual adds (``layer_depth=4``) is a graph; a block's pieces
  run as one ``jax.checkpoint`` under a policy (named products indexed over the run's
  equations) with the model's gradients, dropout included; a block recomputed whole costs
  less by the roofline compiled whole than its pieces apart; and ``fit`` on the graph
  fits XLA's footprint in the budget with the model's gradients."""
  case = rm.build("vit", "test")
  model, variables = rm.init(case)
  traced = trace(model.apply, variables, case.batch, case.kwargs, 4)
  names = tuple(layer.name for layer in traced.layers)
  blocks = [(l, r) for l, r in module_runs(names)
            if names[l].count("/") == 2 and "encoderblock" in names[l]]
  assert traced.is_graph and len(blocks) == 2, blocks
  layers = LayerOptions(traced, roofline_for(None))
  (l0, r0), (l1, r1) = blocks
  named = next(o for o in layers.options(l0, r0) if o.kind == NAMES)
  whole, apart = (layers.measure_run(Group(l0, r0, Option(RECOMPUTE)))[1],
                  sum(layers.measure(i, Option(RECOMPUTE))[1] for i in range(l0, r0)))
  assert 0 < whole < apart
  assert layers.measure_run(Group(l0, r0, named))[0] > 0
  n = len(names)
  plan = PolicyPlan((*(Group(i, i + 1, Option(KEEP)) for i in range(l0)), Group(l0, r0, named),
                     *([Group(r0, l1, Option(RECOMPUTE))] if l1 > r0 else []),
                     Group(l1, r1, Option(DOTS)),
                     *(Group(i, i + 1, Option(KEEP)) for i in range(r1, n))))
  key = input_key(variables, case.batch, case.kwargs)
  loss = rm.loss(case, model.apply)
  want = jax.jit(jax.grad(loss))(variables, case.batch)
  fn = DropIn(model.apply, plan, 4, traced, key)
  _assert_trees_close(want, jax.jit(jax.grad(rm.loss(case, fn)))(variables, case.batch))
  fitted = jaxremat.fit(model.apply, variables, case.batch, 0.75, layer_depth=4,
                        time_steps=False, **case.kwargs)
  assert fitted.measured_total_bytes <= fitted.budget_bytes
  _assert_trees_close(want, jax.jit(jax.grad(rm.loss(case, fitted.fn)))(variables, case.batch))
