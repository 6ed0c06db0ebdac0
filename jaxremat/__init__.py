"""jaxremat: optimal gradient checkpointing for JAX and Flax, proved with XLA's statistics."""

from jaxremat._api.advice import CoarseLayersWarning as CoarseLayersWarning
from jaxremat._api.advice import NoSavingWarning as NoSavingWarning
from jaxremat._api.apply import apply as apply
from jaxremat._api.checks import BatchAxisWarning as BatchAxisWarning
from jaxremat._api.fitted import Fitted as Fitted
from jaxremat._api.fit import fit as fit
from jaxremat._model.policy_plan import Group as Group
from jaxremat._model.policy_plan import Option as Option
from jaxremat._model.policy_plan import PolicyPlan as PolicyPlan
from jaxremat._api.compile import RematUndoneWarning as RematUndoneWarning
from jaxremat._api.dropin import PlanReusedWarning as PlanReusedWarning
from jaxremat._api.compile import jit as jit
from jaxremat._api.result import Remat as Remat
from jaxremat._model.chain import Chain as Chain
from jaxremat._model.chain import Plan as Plan
from jaxremat._model.chain import peak_bytes as peak_bytes
from jaxremat._model.chain import recompute_flops as recompute_flops
from jaxremat._errors import ChainTooLongError as ChainTooLongError
from jaxremat._errors import EmptyModelError as EmptyModelError
from jaxremat._errors import InfeasibleBudgetError as InfeasibleBudgetError
from jaxremat._errors import InputMismatchError as InputMismatchError
from jaxremat._errors import InvalidArgumentError as InvalidArgumentError
from jaxremat._errors import InvalidBudgetError as InvalidBudgetError
from jaxremat._errors import InvalidChainError as InvalidChainError
from jaxremat._errors import InvalidPlanError as InvalidPlanError
from jaxremat._errors import JaxrematError as JaxrematError
from jaxremat._errors import NotAChainError as NotAChainError
from jaxremat._errors import UnknownMethodError as UnknownMethodError
from jaxremat._errors import UnsupportedModelError as UnsupportedModelError
from jaxremat._errors import TargetUnavailableError as TargetUnavailableError
from jaxremat._errors import UnsupportedScanError as UnsupportedScanError
from jaxremat._model.graph import GraphChain as GraphChain
from jaxremat._model.graph import graph_peak_bytes as graph_peak_bytes
from jaxremat._backends.measure import Footprint as Footprint
from jaxremat._backends.measure import compile_footprint as compile_footprint
from jaxremat._api.measure import measure as measure
from jaxremat._backends.targets import Target as Target
from jaxremat._backends.targets import get_target as get_target
from jaxremat._backends.autotune import autotuned_target as autotuned_target
from jaxremat._jaxpr.scan import ScanPlan as ScanPlan
from jaxremat._api.nnx import apply_nnx as apply_nnx
from jaxremat._api.nnx import fit_nnx as fit_nnx
from jaxremat._model.simulate import recompute_counts as recompute_counts
from jaxremat._model.simulate import simulate_peak_bytes as simulate_peak_bytes
from jaxremat.solvers import pareto as pareto
from jaxremat.solvers import solve as solve
from jaxremat.solvers._graph import solve_graph as solve_graph

__version__ = "0.1.0"

__all__ = (
    "BatchAxisWarning",
    "Chain",
    "ChainTooLongError",
    "CoarseLayersWarning",
    "EmptyModelError",
    "Fitted",
    "Footprint",
    "GraphChain",
    "Group",
    "InfeasibleBudgetError",
    "InputMismatchError",
    "InvalidArgumentError",
    "InvalidBudgetError",
    "InvalidChainError",
    "InvalidPlanError",
    "JaxrematError",
    "NoSavingWarning",
    "NotAChainError",
    "Option",
    "Plan",
    "PlanReusedWarning",
    "PolicyPlan",
    "Remat",
    "RematUndoneWarning",
    "ScanPlan",
    "Target",
    "TargetUnavailableError",
    "UnknownMethodError",
    "UnsupportedModelError",
    "UnsupportedScanError",
    "apply",
    "apply_nnx",
    "autotuned_target",
    "compile_footprint",
    "fit",
    "fit_nnx",
    "get_target",
    "graph_peak_bytes",
    "jit",
    "measure",
    "pareto",
    "peak_bytes",
    "recompute_counts",
    "recompute_flops",
    "simulate_peak_bytes",
    "solve",
    "solve_graph",
)
