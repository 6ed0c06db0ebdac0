"""Profile a traced graph (layers reading values made by any earlier layer) into a GraphChain."""

from __future__ import annotations

from collections.abc import Collection

from jaxremat._backends.profile import backward_temp_bytes
from jaxremat._backends.registry import backend_for
from jaxremat._backends.targets import Target
from jaxremat._jaxpr import compat as _compat
from jaxremat._jaxpr.layer_vjp import flops as layer_flops
from jaxremat._jaxpr.residuals import residuals
from jaxremat._jaxpr.trace import TracedChain
from jaxremat._model.graph import GraphChain


def profile_graph(traced: TracedChain, calibrate: bool | Collection[int] = False,
                  platform: str | None = None, target: Target | None = None) -> GraphChain:
  """Bytes of every value crossing between layers, what each layer's backward saves, FLOPs.

  ``traced`` is a traced graph (``traced.is_graph``); ``platform`` (default: JAX's
  default backend) is the backend whose fusion rule says what XLA keeps. Values are the
  batch inputs the layers read (made by unit 0, no cotangent) and every layer output a
  later layer or the model's result reads. A layer's saved inputs and outputs are values
  (counted once however many layers save them); its other residuals are private bytes.
  With ``calibrate`` (one small compile per layer, or per layer whose index it lists: a
  segmented scan's; for ``target`` when given), what XLA's
  temp needs for the layer's backward beyond the residuals it computes becomes its
  workspace: the cotangents and gradient buffers inside a layer (a U-Net level of two
  convs), which model G does not otherwise see.
  """
  layers = traced.layers
  n = len(layers)
  batch = set(traced.batch_vars)
  grad_invariants = set(traced.param_vars) | set(traced.prelude_outputs)
  index: dict = {}
  made: list[int] = []  # per value: the unit (0: the batch, t: layer t) that makes it
  last: list[int] = []
  size: list[int] = []
  cot: list[int] = []

  def add(v, unit, differentiable):
    index[v] = len(made)
    made.append(unit)
    last.append(unit)
    size.append(_compat.aval_bytes(v.aval))
    cot.append(_compat.aval_bytes(v.aval) if differentiable and _compat.is_float(v.aval) else 0)

  for t, layer in enumerate(layers, start=1):
    for v in layer.invariants:
      if v in batch and v not in index:
        add(v, 0, False)
      if v in index:
        last[index[v]] = t
    for v in layer.inputs:
      last[index[v]] = t
    for v in dict.fromkeys([*layer.outputs, *layer.side_outputs]):
      add(v, t, True)
  for layer in layers:
    for v in layer.side_outputs:
      last[index[v]] = n + 1  # read by the loss, after the last layer
  keep = backend_for(platform).keep_rule()  # as XLA keeps them on that backend
  saved, private, flops, work = [], [], [], []
  for i, layer in enumerate(layers):
    res = residuals(layer, layer.inputs, grad_invariants, differentiate_inputs=True, keep=keep)
    values = res.own_input_vars | res.own_output_vars
    saved.append(sorted(index[v] for v in values))
    private.append(res.total - res.own_input - sum(size[index[v]] for v in res.own_output_vars))
    flops.append(layer_flops(layer, layer.inputs))
    if calibrate is True or (calibrate and i in calibrate):
      temp = backward_temp_bytes(layer, layer.inputs, grad_invariants, True, target)
      work.append(max(0, temp - (res.total - res.own_input)))
    else:
      work.append(0)
  return GraphChain(
      value_bytes=size, value_cot_bytes=cot, defined=made, last_use=last, saved=saved,
      res_bytes=private, workspace_bytes=work if calibrate else None, flops=flops,
      names=[layer.name for layer in layers])
