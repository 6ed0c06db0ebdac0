"""Compile targets: XLA's GPU compiler run deviceless, for a GPU this machine does not have.

With JAX's CUDA plugin installed, ``jax.experimental.topologies`` builds a compile-only
device from a ``GpuTargetConfigProto`` (a text proto of the GPU's facts). A step lowered
with abstract arguments on that device compiles for that GPU, and
``compiled.memory_analysis()`` gives its buffer assignment: nothing runs, and no GPU,
driver or NVIDIA library is needed. On a machine without a GPU, ``JAX_PLATFORMS=cpu`` (or
``JAX_SKIP_CUDA_CONSTRAINTS_CHECK=1``) must be set before JAX starts: otherwise the
plugin's CUDA version check fails and the plugin does not register.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import importlib.resources
import importlib.util
import os
import re
import sys
import tempfile
from collections.abc import Callable, Iterator, Mapping
from typing import Any

import jax
import jaxlib

from jaxremat._backends.measure import Footprint, footprint_of
from jaxremat._errors import InvalidArgumentError, TargetUnavailableError

#: Options that matched the recorded H100 runs best: without autotuning (which needs the
#: device) XLA would pick Triton for matmuls that the measured run gave to cuBLAS.
GPU_AOT_OPTIONS: tuple[tuple[str, str | bool], ...] = (("xla_gpu_enable_triton_gemm", False),)

#: Built-in target name -> its config file under ``target_configs/``.
BUILTIN = {"h100": "h100.txtpb", "h200": "h200.txtpb", "a100": "a100.txtpb"}

#: ``gpu_device_info`` fields without which XLA's GPU compiler crashes the process (a
#: division by zero: ``threads_per_warp``, ``block_dim_limit_x``), fails (no compute
#: capability) or sizes its kernels for no device (``core_count``).
REQUIRED_DEVICE_FIELDS = ("threads_per_warp", "block_dim_limit_x", "core_count")

#: The modules of the CUDA plugin's two packages (jax-cudaNN-pjrt, jax-cudaNN-plugin), per
#: CUDA major version; either set serves (jax's CUDA 13 wheels on a GPU machine, say).
PLUGIN_MODULES = {12: ("jax_plugins.xla_cuda12", "jax_cuda12_plugin"),
                  13: ("jax_plugins.xla_cuda13", "jax_cuda13_plugin")}


@dataclasses.dataclass(frozen=True)
class Target:
  """A GPU to compile for without having it.

  Attributes:
    name: a short name (``"h100"``) or the config's ``device_description_str``.
    config: the ``GpuTargetConfigProto`` text proto (``platform_name: "CUDA"`` ...).
    memory_bytes: the device memory the config declares (bytes; 0 when it declares none).
    compiler_options: XLA options added to every compile for this target.
    platform: JAX's platform of the compiler (``"cuda"``).
  """

  name: str
  config: str
  memory_bytes: int
  compiler_options: tuple[tuple[str, str | bool], ...] = GPU_AOT_OPTIONS
  platform: str = "cuda"


def get_target(spec: str | Target | None) -> Target | None:
  """The target ``spec`` names.

  Args:
    spec: ``None`` (the local backend: no target), a ``Target``, a built-in name
      (``"h100"``, ``"h200"``, ``"a100"``), the path of a target config file, or its text.

  Returns:
    The ``Target``, or ``None`` for ``None``.

  Raises:
    InvalidArgumentError: ``spec`` is none of these, names no file, or its config is not
      a CUDA target config with the device facts XLA needs (``REQUIRED_DEVICE_FIELDS``
      and the compute capability).
  """
  if spec is None or isinstance(spec, Target):
    return spec
  if not isinstance(spec, str):
    raise InvalidArgumentError(
        f"target must be a name ({', '.join(BUILTIN)}), a target config path or text, a "
        f"Target or None, got {type(spec).__name__}.")
  if spec.lower() in BUILTIN:
    text = importlib.resources.files("jaxremat._backends").joinpath(
        "target_configs", BUILTIN[spec.lower()]).read_text()
    return _from_config(text, spec.lower())
  if "platform_name" in spec or "gpu_device_info" in spec:
    return _from_config(spec, None)
  if os.path.isfile(spec):
    with open(spec) as f:
      return _from_config(f.read(), None)
  if os.sep in spec or spec.endswith((".txtpb", ".pbtxt", ".txt", ".textproto")):
    raise InvalidArgumentError(
        f"target={spec!r} looks like the path of a target config file, but no such file "
        f"exists (from {os.getcwd()!r}). Give an existing file, its text, or a built-in "
        f"name: {', '.join(BUILTIN)}.")
  raise InvalidArgumentError(
      f"Unknown target {spec!r}: expected one of {', '.join(BUILTIN)}, the path of a "
      "GpuTargetConfigProto text file, or its text.")


def _from_config(text: str, name: str | None) -> Target:
  platform = re.search(r'^\s*platform_name\s*:\s*"([^"]*)"', text, re.MULTILINE)
  if platform is None or platform.group(1).upper() != "CUDA":
    found = f'platform_name "{platform.group(1)}"' if platform else "no platform_name"
    raise InvalidArgumentError(
        f'A target config must be a GpuTargetConfigProto text proto with platform_name: '
        f'"CUDA" (XLA\'s CUDA compiler is the one jaxremat drives); this one has {found}.')
  missing = [f for f in REQUIRED_DEVICE_FIELDS if config_number(text, f) <= 0]
  if not re.search(r"cuda_compute_capability\s*{[^}]*major\s*:\s*[1-9]", text):
    missing.append("cuda_compute_capability { major }")
  if missing or not re.search(r"^\s*gpu_device_info\s*{", text, re.MULTILINE):
    raise InvalidArgumentError(
        "The target config lacks device facts XLA's GPU compiler needs (without them it "
        f"crashes the process or compiles for no device): gpu_device_info {{ "
        f"{', '.join(missing or ['the whole block'])} }}. Start from a built-in config "
        "and edit it: print(jaxremat.get_target('h100').config).")
  described = re.search(r'^\s*device_description_str\s*:\s*"([^"]*)"', text, re.MULTILINE)
  return Target(name=name or (described.group(1) if described else "custom"), config=text,
                memory_bytes=int(config_number(text, "device_memory_size")))


def config_number(config: str, field: str) -> float:
  """The number a target config gives ``field`` (its first line ``field: N``), 0 when it
  gives none."""
  found = re.search(rf"^\s*{field}\s*:\s*([0-9.eE+-]+)", config, re.MULTILINE)
  try:
    return float(found.group(1)) if found else 0.0
  except ValueError:
    return 0.0


def _install_hint() -> str:
  version = jaxlib.__version__
  return (f'Install it with `pip install "jaxremat[cuda12-aot]"`, or with no dependency at '
          f"all `pip install --no-deps jax-cuda12-plugin=={version} "
          f"jax-cuda12-pjrt=={version}` (no GPU, driver or NVIDIA library is needed).")


def target_device(target: Target) -> jax.Device:
  """The compile-only device of ``target`` (one per config, kept).

  Raises:
    TargetUnavailableError: the CUDA plugin is not installed, or it did not register
      (on a machine without a GPU: JAX was started without ``JAX_PLATFORMS=cpu``).
  """
  if not plugin_installed():
    missing = [m for m in PLUGIN_MODULES[12] if not _installed(m)]
    raise TargetUnavailableError(
        f"Compiling for the {target.name} target needs JAX's CUDA plugin, which is not "
        f"installed (no module {', '.join(missing)}). {_install_hint()} On a machine "
        "without a GPU, also set JAX_PLATFORMS=cpu in the environment before JAX starts.")
  try:
    with _stderr_kept() as stderr:
      return _device(target.platform, target.config)
  except jax.errors.JaxRuntimeError as e:
    if "parse" not in str(e).lower():
      raise
    said = [line.split("] ", 1)[-1].strip().rstrip(".")
            for line in "".join(stderr).splitlines() if "text_format" in line]
    raise InvalidArgumentError(
        f"XLA cannot parse the target config of {target.name!r} as a GpuTargetConfigProto "
        f"text proto: {said[-1] if said else e}. Start from a built-in config and edit it: "
        "print(jaxremat.get_target('h100').config).") from None
  except NotImplementedError as e:  # the plugin did not register
    platforms = getattr(jax.config, "jax_platforms", None)  # what JAX was asked to start
    if platforms and not {"cuda", "gpu"} & set(platforms.split(",")):
      why = (f"JAX's platforms are {platforms!r} now, but were set after JAX had started "
             "its backends")
    else:
      why = f"JAX started with {'JAX_PLATFORMS=' + platforms if platforms else 'no JAX_PLATFORMS'}"
    raise TargetUnavailableError(
        f"JAX's CUDA plugin is installed but did not register, so XLA's GPU compiler is not "
        f"available for the {target.name} target: on a machine without a GPU the plugin's "
        f"CUDA check fails unless JAX starts with platforms that exclude CUDA ({why}). Set "
        f"JAX_PLATFORMS=cpu (or JAX_SKIP_CUDA_CONSTRAINTS_CHECK=1) in the environment before "
        f"JAX starts, e.g. `JAX_PLATFORMS=cpu python train.py`, or call "
        f"jax.config.update('jax_platforms', 'cpu') before the first JAX computation.") from e


@contextlib.contextmanager
def _stderr_kept() -> Iterator[list[str]]:
  """Keeps what XLA's C++ code writes to the process's stderr meanwhile (its text-proto
  parser says only there where a config is wrong): the list yielded gets the text on
  exit, and the text is written through to stderr then."""
  kept: list[str] = []
  sys.stderr.flush()
  saved = os.dup(2)
  with tempfile.TemporaryFile() as captured:
    os.dup2(captured.fileno(), 2)
    try:
      yield kept
    finally:
      os.dup2(saved, 2)
      os.close(saved)
      captured.seek(0)
      kept.append(captured.read().decode(errors="replace"))
      sys.stderr.write(kept[0])


def plugin_installed() -> bool:
  """Whether all modules of one CUDA plugin (of any CUDA major version) are installed."""
  return any(all(_installed(m) for m in modules) for modules in PLUGIN_MODULES.values())


def _installed(module: str) -> bool:
  try:
    return importlib.util.find_spec(module) is not None
  except ModuleNotFoundError:  # its parent package is missing
    return False


@functools.cache
def _device(platform: str, config: str) -> jax.Device:
  from jax.experimental import topologies

  topology = topologies.get_topology_desc(platform=platform, target_config=config,
                                          topology="1x1x1")
  return topology.devices[0]


def abstract(tree: Any, device: jax.Device) -> Any:
  """``tree`` with every array leaf as a ``ShapeDtypeStruct`` placed on ``device``.

  Arrays (sharded ones too: their global shape), ``ShapeDtypeStruct`` s and Python
  scalars become ``jax.ShapeDtypeStruct(shape, dtype, sharding=SingleDeviceSharding(
  device))``; concrete arrays would lower for the local backend instead.

  Raises:
    InvalidArgumentError: a leaf is not an array, a ``ShapeDtypeStruct`` or a scalar.
  """
  sharding = jax.sharding.SingleDeviceSharding(device)

  def leaf(x: Any) -> jax.ShapeDtypeStruct:
    if not isinstance(x, jax.ShapeDtypeStruct):
      try:
        x = jax.typeof(x)
      except TypeError as e:
        raise InvalidArgumentError(
            f"Every leaf must be an array, a ShapeDtypeStruct or a scalar to compile for a "
            f"target, got {type(x).__name__}.") from e
    return jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=sharding,
                                weak_type=getattr(x, "weak_type", False))

  return jax.tree_util.tree_map(leaf, tree)


def compile_on_target(fn: Callable[..., Any], args: tuple[Any, ...], target: Target | str,
                      compiler_options: Mapping[str, str | bool] | None = None) -> Any:
  """Compiles ``jax.jit(fn)(*args)`` for ``target``; nothing runs.

  Args:
    fn: the function to compile (e.g. ``jax.grad(loss_fn)``).
    args: its positional arguments: arrays or ``ShapeDtypeStruct`` s (only shapes and
      dtypes are read).
    target: a ``Target`` or anything ``get_target`` accepts but ``None``.
    compiler_options: XLA options, added to (and overriding) the target's own.

  Returns:
    The ``jax.stages.Compiled`` step: ``memory_analysis()`` gives the target's buffers.

  Raises:
    TargetUnavailableError: see ``target_device``.
  """
  resolved = _resolve(target)
  device = target_device(resolved)
  options = _options(resolved, compiler_options)
  return jax.jit(fn).lower(*abstract(args, device)).compile(compiler_options=options or None)


def target_footprint(fn: Callable[..., Any], args: tuple[Any, ...], target: Target | str,
                     compiler_options: Mapping[str, str | bool] | None = None) -> Footprint:
  """XLA's footprint of ``jax.jit(fn)(*args)`` compiled for ``target`` (bytes).

  ``Footprint.backend`` is ``"gpu"``; ``flops`` is XLA's cost analysis of the program
  lowered for the local backend before optimisation (the GPU compiler's own needs a
  device). Arguments as for ``compile_on_target``.

  Raises:
    TargetUnavailableError: see ``target_device``.
    UnsupportedModelError: XLA reports no memory statistics.
  """
  resolved = _resolve(target)
  compiled = compile_on_target(fn, args, resolved, compiler_options)
  local = jax.tree_util.tree_map(  # the same arguments, unplaced: lowered for this machine
      lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, weak_type=x.weak_type),
      abstract(args, target_device(resolved)))
  cost = jax.jit(fn).lower(*local).cost_analysis()
  return footprint_of(compiled, float((cost or {}).get("flops", 0.0)), "gpu",
                      _options(resolved, compiler_options))


def _resolve(target: Target | str) -> Target:
  resolved = get_target(target)
  if resolved is None:
    raise InvalidArgumentError("target must name a GPU to compile for, got None.")
  return resolved


def _options(target: Target, extra: Mapping[str, str | bool] | None) -> dict[str, str | bool]:
  """The target's options, then ``extra``; no HLO pass disabled unless ``extra`` says so:
  a process-wide ``XLA_FLAGS=--xla_disable_hlo_passes=cse_barrier_expander`` (the CPU
  advice) would leave barriers the GPU compiler cannot emit."""
  return {"xla_disable_hlo_passes": "", **dict(target.compiler_options), **dict(extra or {})}
