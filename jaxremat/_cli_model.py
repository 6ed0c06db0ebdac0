"""The model a ``jaxremat plan`` or ``fit`` command names: loaded by import path
(``MODULE:ATTR``), with its abstract variables and a batch of the given shape."""

from __future__ import annotations

import importlib
import os
import sys
from collections.abc import Sequence
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp
from flax import nnx

from jaxremat._errors import InvalidArgumentError
from jaxremat._jaxpr.raised import missing_inputs, model_callee


def load_model(spec: str, command: str = "plan") -> Any:
  """``MODULE:ATTR`` -> a Flax module: the attribute itself, or what calling it returns.

  ``MODULE`` is imported as ``python -m`` would: the current directory comes first on the
  path, so a local ``models.py`` is found without ``PYTHONPATH``. Errors name
  ``jaxremat {command}``.
  """
  this = f"jaxremat {command}"
  module_name, _, attr = spec.partition(":")
  if not module_name or not attr:
    raise SystemExit(f"{this}: expected MODULE:ATTR (e.g. jaxremat.zoo:all_conv), got {spec!r}")
  if os.getcwd() not in sys.path and "" not in sys.path:
    sys.path.insert(0, os.getcwd())
  try:
    target: Any = importlib.import_module(module_name)
  except ImportError as err:
    raise SystemExit(f"{this}: cannot import {module_name!r} ({err}); run from the "
                     "directory that holds it, or install it.") from None
  for part in attr.split("."):
    if not hasattr(target, part):
      raise SystemExit(f"{this}: {module_name!r} has no attribute {attr!r}.")
    target = getattr(target, part)
  in_python = ("jaxremat.fit_nnx(model, batch, memory_budget)" if command == "fit"
               else "jaxremat.apply_nnx(model, batch)")
  nnx_hint = f"{this} takes flax.linen modules; plan a flax.nnx module in Python with {in_python}"
  if isinstance(target, nn.Module):
    return target
  if isinstance(target, nnx.Module) or (isinstance(target, type)
                                        and issubclass(target, nnx.Module)):
    raise SystemExit(f"{this}: {spec} is a flax.nnx module: {nnx_hint}.")
  try:
    model = target()
  except TypeError as err:  # a class or function that needs arguments
    raise SystemExit(f"{this}: calling {spec}() failed ({err}): give the module "
                     "itself, or a function of no arguments that returns it.") from None
  if isinstance(model, nnx.Module):
    raise SystemExit(f"{this}: {spec} gave a flax.nnx module ({type(model).__name__}): "
                     f"{nnx_hint}.")
  if not isinstance(model, nn.Module):
    raise SystemExit(f"{this}: {spec} gave a {type(model).__name__}, not a flax.linen Module")
  return model


def model_inputs(spec: str, batch_shape: Sequence[int], dtype: str,
                 model_kwargs: dict[str, Any] | None, rngs: Sequence[str],
                 concrete: bool = False, command: str = "plan"
                 ) -> tuple[nn.Module, Any, jax.Array, dict[str, Any]]:
  """The module at ``spec``, its variables (abstract unless ``concrete``: planning
  allocates nothing), a random batch of ``batch_shape`` and the call's keyword arguments
  (``rngs`` named, ``mutable`` added where the model has ``batch_stats``)."""
  model = load_model(spec, command)
  key, shape = jax.random.key(1), tuple(batch_shape)
  x = (jax.random.randint(key, shape, 0, 2, dtype)  # token ids within any vocabulary
       if jnp.issubdtype(jnp.dtype(dtype), jnp.integer)
       else jax.random.normal(key, shape).astype(dtype))
  kwargs: dict[str, Any] = dict(model_kwargs or {})
  if rngs:
    kwargs["rngs"] = {name: jax.random.key(2 + k) for k, name in enumerate(rngs)}
  init = lambda: model.init(  # every collection
      {"params": jax.random.key(0), **kwargs.get("rngs", {})}, x,
      **{k: v for k, v in kwargs.items() if k not in ("rngs", "mutable")})
  try:
    params = jax.jit(init)() if concrete else jax.eval_shape(init)
  except TypeError as err:
    if inputs := missing_inputs(err, model_callee(model.apply)):
      raise InvalidArgumentError(
          f"the model takes {', '.join(map(repr, inputs))} besides the batch, and the command "
          "line passes it one random batch: plan a module whose __call__ takes the batch "
          f"alone ({', '.join(map(repr, inputs))} made inside it), or call jaxremat from "
          f"Python with the other inputs by keyword (jaxremat.apply(model.apply, params, x, "
          f"{inputs[0]}={inputs[0]})).") from err
    raise
  if "batch_stats" in params:
    kwargs["mutable"] = ["batch_stats"]
  return model, params, x, kwargs
