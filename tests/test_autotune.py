"""A GPU's autotune results loaded deviceless (``_backends.autotune``). The porting and the
errors are checked everywhere; the compile needs JAX's CUDA plugin with the compiler of
jax 0.11 or later (``pip install --no-deps "jax-cuda12-pjrt>=0.11"``) and, without a GPU,
``JAX_PLATFORMS=cpu``. Its oracle is the footprint the H100 itself reported."""

import json
import os

import jax
import pytest

import jaxremat
from jaxremat._backends import autotune, targets
from jaxremat._errors import InvalidArgumentError, TargetUnavailableError

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
RECORDED = os.path.join(ROOT, "bench", "results", "gpu-h100")

ENTRIES = """entries {
  key { target { device: "699b92c0fb30cb16" hlo_fingerprint: "a" } }
  value {
    optimal_config {
      backend: CUBLASLT_FISSION
      backend_config { gemm { autotune_workspace_size: 33554432 } }
    }
    optimal_backend_version: "13.0.0"
  }
}
entries {
  key { target { device: "699b92c0fb30cb16" hlo_fingerprint: "b" } }
  value {
    optimal_config {
      backend: TRITON
    }
    optimal_backend_version: "a77e7c79"
  }
}
entries {
  key { target { device: "699b92c0fb30cb16" hlo_fingerprint: "c" } }
  value {
    optimal_config {
      backend: CUDNN
    }
    optimal_backend_version: "9.19.0"
  }
}
"""


def test_port_rewrites_only_the_library_versions():
  ported = autotune.port_autotune_results(ENTRIES)
  assert ported.count('optimal_backend_version: "0.0.0"') == 2  # cuBLASLt and cuDNN
  assert 'optimal_backend_version: "a77e7c79"' in ported  # Triton's is the compiler's own
  assert "13.0.0" not in ported and "9.19.0" not in ported
  assert "autotune_workspace_size: 33554432" in ported  # the choice itself is kept
  assert len(ported.splitlines()) == len(ENTRIES.splitlines())


def test_autotuned_target_loads_the_ported_file(tmp_path, monkeypatch):
  monkeypatch.setattr(autotune, "compiler_version", lambda: (0, 11))
  path = tmp_path / "results.textproto"
  path.write_text(ENTRIES)
  tuned = jaxremat.autotuned_target("h100", str(path))
  options = dict(tuned.compiler_options)
  assert options["xla_gpu_enable_triton_gemm"] is True  # the device's choices decide
  assert options["xla_gpu_use_new_autotune_cache_format"] is True
  with open(options["xla_gpu_load_autotune_results_from"]) as f:
    assert f.read() == autotune.port_autotune_results(ENTRIES)
  assert tuned.config == targets.get_target("h100").config and tuned.name == "h100"


def test_autotuned_target_errors(tmp_path, monkeypatch):
  with pytest.raises(InvalidArgumentError, match="No autotune results"):
    jaxremat.autotuned_target("h100", str(tmp_path / "missing.textproto"))
  legacy = tmp_path / "legacy.textproto"
  legacy.write_text("version: 3\nresults {\n  device: \"CUDA: 9.0\"\n}\n")
  with pytest.raises(InvalidArgumentError, match="jax 0.11 or later"):
    jaxremat.autotuned_target("h100", str(legacy))
  good = tmp_path / "results.textproto"
  good.write_text(ENTRIES)
  monkeypatch.setattr(autotune, "compiler_version", lambda: (0, 10))
  with pytest.raises(TargetUnavailableError, match="jax-cuda-pjrt 0.10"):
    jaxremat.autotuned_target("h100", str(good))


@pytest.mark.skipif(
    not targets.plugin_installed() or (autotune.compiler_version() or (0, 0)) < (0, 11),
    reason="needs JAX's CUDA plugin with jax 0.11's compiler: "
           'pip install --no-deps "jax-cuda12-pjrt>=0.11"')
def test_vgg16_compiles_to_the_footprint_the_h100_reported():
  # Without the H100's autotune choices this step compiles 41 MiB under the device's
  # figure (cuDNN workspaces and Triton-or-cuBLAS choices, bench/results/gpu-aot-h100).
  from jaxremat import zoo_registry
  from jaxremat._api.loss import training_loss

  name = "vgg16-b512-32px"
  with open(os.path.join(RECORDED, "compile-only.json")) as f:
    recorded = next(r for r in json.load(f)["results"]
                    if r["model"] == name and r["strategy"] == "none")
  entry = zoo_registry.get(name)
  model, x = entry.build(), entry.example()
  params = jax.eval_shape(model.init, jax.random.key(0), x)
  x = jax.ShapeDtypeStruct(x.shape, x.dtype)
  tuned = jaxremat.autotuned_target("h100", os.path.join(RECORDED, "autotune", f"{name}.textproto"))
  found = targets.target_footprint(jax.grad(training_loss(model.apply, {})), (params, x), tuned,
                                   {"xla_disable_hlo_passes": "rematerialization"})
  assert found.total_bytes == recorded["compiled_bytes"]
