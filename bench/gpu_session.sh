#!/usr/bin/env bash
# The runs of a lent GPU session, stage by stage, inside one wall-clock allowance.
#
#   bash bench/gpu_session.sh OUTDIR SECONDS STAGE...
#
# Stages (each writes under OUTDIR, so what finished survives a later stage cut off):
#   env                 nvidia-smi, versions, cores, the measured roofline -> env.txt
#   smoke               bench/policies.py on one small model    (stops the session if it fails)
#   policies:M1,M2,...  bench/policies.py per model on the GPU  -> policies/<model>.json
#   budget:M1,M2,...    bench/budget.py per model on the GPU: apply(budget_bytes=), each
#                       plan compiled with its prediction       -> budget/<model>.json
#   autotune            gpu_validate.py --compile-only with XLA dumps and autotune results
#                                                               -> compile/, dumps/, autotune/
#   aot                 gpu_aot.py deviceless on this machine, with and without those
#                       autotune results                        -> aot/, aot-autotune/
#   steps:M1,M2,...     gpu_validate.py: step times and allocator peaks per plan -> steps/
# Run from the repository root on the GPU machine (jax with CUDA, flax, optax, chex).
# With ARCHIVE=PATH.tgz set, OUTDIR is archived there after each model and stage: a device
# tool that brings back only a few files from its output folder then brings back one
# archive, the last one written if the run is cut off.
set -u
out=$1; allowance=$2; shift 2
mkdir -p "$out"
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1
deadline=$(( $(date +%s) + allowance ))
left() { echo $(( deadline - $(date +%s) )); }
name() { echo "$1" | tr -c 'A-Za-z0-9._\n-' '_'; }
per_model() {  # per_model KIND SCRIPT [ARG...]: SCRIPT once per model the stage names
  local kind=$1 script=$2 m
  shift 2
  IFS=, read -ra models <<< "${stage#"$kind":}"
  for m in "${models[@]}"; do
    [ "$(left)" -gt 30 ] || { echo "$kind $m: no time left" >> "$out/skipped.txt"; continue; }
    timeout "$(left)" python3 "$script" --models "$m" "$@" \
      --out "$out/$kind/$(name "$m").json" > "$out/$kind-$(name "$m").log" 2>&1
    echo "$kind $m: rc $? ($(left) s left)"
    archive
  done
}
archive() {
  [ -n "${ARCHIVE:-}" ] || return 0
  tar czf "$ARCHIVE.part" -C "$(dirname "$out")" "$(basename "$out")" && mv "$ARCHIVE.part" "$ARCHIVE"
}

for stage in "$@"; do
  [ "$(left)" -gt 20 ] || {
    echo "no time left for $stage" | tee -a "$out/skipped.txt"; continue; }
  echo "== $stage ($(left) s left)"
  case $stage in
    env)
      { date -u; nvidia-smi; nproc
        python3 -c "import jax, flax, optax, chex; print(jax.__version__, flax.__version__,
          optax.__version__, chex.__version__, jax.devices())"
        python3 -m pip list 2>/dev/null | grep -iE "^(jax|jaxlib|jax-cuda|flax|optax|chex|numpy)"
        python3 -c "from jaxremat._backends.roofline import local_roofline
print(local_roofline())"
      } > "$out/env.txt" 2>&1 ;;
    smoke)
      if ! timeout "$(left)" python3 bench/policies.py --models mlp-uneven --rounds 1 \
          --out "$out/smoke/policies.json" > "$out/smoke.log" 2>&1; then
        echo "smoke failed"; tail -40 "$out/smoke.log"; exit 1
      fi ;;
    policies:*) per_model policies bench/policies.py --rounds 3 ;;
    budget:*) per_model budget bench/budget.py ;;
    autotune)
      timeout "$(left)" python3 bench/gpu_validate.py "$out/compile" --compile-only \
        --dump "$out/dumps" --autotune-dump "$out/autotune" --budget-seconds "$(( $(left) - 10 ))" \
        > "$out/compile.log" 2>&1
      echo "autotune: rc $?" ;;
    aot)
      for mode in plain autotune; do
        [ "$(left)" -gt 40 ] || { echo "aot $mode: no time left" >> "$out/skipped.txt"; continue; }
        extra=(); [ $mode = autotune ] && extra=(--autotune "$out/autotune")
        timeout "$(left)" python3 bench/gpu_aot.py "$out/aot-$mode" \
          --recorded "$out/compile/gpu_validation.json" --dumps "$out/dumps" "${extra[@]}" \
          --budget-seconds "$(( $(left) - 10 ))" > "$out/aot-$mode.log" 2>&1
        echo "aot $mode: rc $?"
      done ;;
    steps:*)
      timeout "$(left)" python3 bench/gpu_validate.py "$out/steps" --only "${stage#steps:}" \
        --budget-seconds "$(( $(left) - 10 ))" > "$out/steps.log" 2>&1
      echo "steps: rc $?" ;;
    *) echo "unknown stage $stage"; exit 2 ;;
  esac
  archive
done
echo "done ($(left) s left)"
