"""A GPU's own autotune results, loaded by a deviceless compile for that GPU.

Without the device, XLA cannot time the candidates for a matrix product or a convolution
(cuBLAS or Triton, which algorithm, how much workspace), and its guesses can differ from
the device's choices by tens of MiB of workspace. jax 0.11's compiler writes those choices
(``--xla_gpu_dump_autotune_results_to``) keyed by a fingerprint of the device's facts (its
compute capability, cores, clock, memory bandwidth and L2 size), a fingerprint of the
instruction's HLO, and the version of the library that gave the choice. A deviceless
compile has no cuBLAS or cuDNN to ask for a version and uses ``"0.0.0"``, so every library
entry would miss; ``port_autotune_results`` rewrites those versions and keeps the choices.
"""

from __future__ import annotations

import dataclasses
import hashlib
import importlib.metadata
import os
import re
import tempfile

from jaxremat._backends.targets import Target, get_target
from jaxremat._errors import InvalidArgumentError, TargetUnavailableError

#: Autotune backends that are libraries: an entry of theirs carries the library's version.
LIBRARY_BACKENDS = ("CUBLAS", "CUBLASLT", "CUBLASLT_FISSION", "CUDNN")
#: The version a deviceless compile reads for those libraries.
DEVICELESS_LIBRARY_VERSION = "0.0.0"
#: The first jax whose GPU compiler reads the format with entries keyed by device.
FIRST_COMPILER = (0, 11)


def port_autotune_results(text: str) -> str:
  """``text`` (autotune results in jax 0.11's format) with each library entry's
  ``optimal_backend_version`` set to the deviceless compile's; all else unchanged."""
  out, backend = [], None
  for line in text.splitlines(keepends=True):
    found = re.match(r"\s*backend: (\w+)\s*$", line)
    backend = found.group(1) if found else backend
    if backend in LIBRARY_BACKENDS and line.lstrip().startswith("optimal_backend_version:"):
      line = re.sub(r'"[^"]*"', f'"{DEVICELESS_LIBRARY_VERSION}"', line)
    out.append(line)
  return "".join(out)


def compiler_version() -> tuple[int, int] | None:
  """(major, minor) of the installed CUDA plugin's compiler (jax-cudaNN-pjrt), or None."""
  for package in ("jax-cuda12-pjrt", "jax-cuda13-pjrt"):
    try:
      major, minor = importlib.metadata.version(package).split(".")[:2]
      return int(major), int(minor)
    except importlib.metadata.PackageNotFoundError:
      continue
  return None


def autotuned_target(target: str | Target, results_path: str) -> Target:
  """``target``, its compiles loading the autotune results a real device wrote.

  Args:
    target: anything ``target=`` accepts (``"h100"``, a config, a ``Target``); its
      facts must be the device's (the results are keyed by them).
    results_path: the text file of ``--xla_gpu_dump_autotune_results_to`` from a training
      step compiled on that device with jax 0.11 or later. (For a machine without a GPU:
      on the GPU itself, XLA autotunes as it compiles.)

  Returns:
    A ``Target`` whose compiles make the device's library and Triton choices where the
    HLO matches (the ported results are written once to the temporary directory).

  Raises:
    InvalidArgumentError: ``results_path`` is not a file in that format.
    TargetUnavailableError: the installed compiler is older than jax 0.11.
  """
  base = get_target(target)
  if base is None:
    raise InvalidArgumentError("autotuned_target needs a GPU target, got None.")
  if not os.path.isfile(results_path):
    raise InvalidArgumentError(f"No autotune results at {results_path!r}.")
  with open(results_path) as source:
    text = source.read()
  if not re.search(r"^entries\s*\{", text, re.MULTILINE):
    raise InvalidArgumentError(
        f"{results_path!r} is not in the autotune format of jax 0.11 or later (top-level "
        "`entries {...}` keyed by device): dump it with "
        "XLA_FLAGS=--xla_gpu_dump_autotune_results_to=FILE on the device under jax 0.11+.")
  version = compiler_version()
  if version is None or version < FIRST_COMPILER:
    found = "none installed" if version is None else "jax-cuda-pjrt %d.%d" % version
    raise TargetUnavailableError(
        f"Loading a device's autotune results needs the GPU compiler of jax 0.11 or later "
        f"({found}): `pip install --no-deps 'jax-cuda12-pjrt>=0.11'`.")
  ported = port_autotune_results(text)
  digest = hashlib.sha256(ported.encode()).hexdigest()[:16]
  path = os.path.join(tempfile.gettempdir(), f"jaxremat-autotune-{digest}.textproto")
  if not os.path.exists(path):
    with tempfile.NamedTemporaryFile("w", dir=os.path.dirname(path), delete=False) as out:
      out.write(ported)
    os.replace(out.name, path)
  options = {**dict(base.compiler_options), "xla_gpu_enable_triton_gemm": True,
             "xla_gpu_use_new_autotune_cache_format": True,
             "xla_gpu_load_autotune_results_from": path}
  return dataclasses.replace(base, compiler_options=tuple(options.items()))
