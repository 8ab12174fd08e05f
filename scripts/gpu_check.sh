#!/usr/bin/env bash
# The GPU check: build, test, sanitize and benchmark every CUDA kernel in one go, within the few
# minutes a GPU machine is lent (docs/install.md, "The GPU check").
#
#   bash scripts/gpu_check.sh                 # on a machine with an NVIDIA GPU (no network needed)
#   bash scripts/gpu_check.sh --dry-run       # rehearsal on a machine without one (see below)
#   make gpu-check                            # the same as the first line
#
# Stages, each under its own time limit so that one hang cannot eat the lease:
#   env       what the machine has (GPU, driver, torch, nvcc, compute-sanitizer), and the carried
#             wheels (gpu_wheels/, made by scripts/gpu_wheels.sh) installed into a private folder
#   build     the extension, in place, for the GPU found only (e.g. TORCH_CUDA_ARCH_LIST=9.0),
#             with every core, against the torch that is installed (nothing is downloaded)
#   test      every test that needs a GPU (pytest -m cuda, VMFDIST_REQUIRE_GPU=1: a GPU test that
#             skips fails): CPU<->GPU agreement of every op and distribution, no host syncs,
#             torch.compile and CUDA-graph capture, indices past 2**31
#   sanitize  compute-sanitizer memcheck, racecheck, synccheck and initcheck over
#             scripts/gpu_kernels.py (every op on empty, one-element, odd, strided and broadcast inputs)
#   bench     python -m benchmarks.run gpu (fused ops vs composites and TFP-JAX, bandwidth bounds,
#             layer and noisy K-FAC steps vs the deterministic step and bayesian-torch, LeNet-5 epochs)
#
# Everything lands in $OUT if set (the device tool brings it back), else gpu_check_out/: at most
# eight files -- summary.md (one line per stage, the failures' tails, the benchmark tables),
# timings.json, bench.md, bench.json and logs.tar.gz (every log, the test report, the env).
#
# Options: --dry-run; --stages env,build,test,sanitize,bench (a subset, in this order);
# --python PY (default: python3, or $PYTHON).  Stage limits (seconds) can be changed with
# GPU_CHECK_LIMIT_<STAGE>=N, e.g. GPU_CHECK_LIMIT_BENCH=120; the whole run's with GPU_CHECK_BUDGET=N
# (default 540); GPU_CHECK_BENCH_ARGS adds options to the benchmark (e.g. "--rounds 5").
#
# --dry-run (no GPU): copies the tracked tree to a scratch folder (/tmp/vmfdist-gpu-dry-*, one per
# python, kept for the next rehearsal) and there builds for sm_90
# (TORCH_CUDA_ARCH_LIST=9.0, as on an H100/H200) against the given python's torch, collects the
# GPU tests, runs the sanitizer's driver and the benchmark on the CPU (--device cpu --quick),
# checks that the wheels in gpu_wheels/ are complete for the GPU machine (Python 3.12), and
# prints the command to give the GPU machine.  Run it against torch 2.11 (the GPU machine's) with
# --python pointing at an environment that has it: it then also leaves the module it built in
# gpu_prebuilt/ (stripped, with a MANIFEST of torch version, architecture and source hash), which
# the GPU run uses if its own build fails or runs out of time.
set -uo pipefail
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
DRY=0
STAGES="env,build,test,sanitize,bench"
PY="${PYTHON:-python3}"
while [ $# -gt 0 ]; do
  case "$1" in
    --dry-run) DRY=1 ;;
    --stages) STAGES="$2"; shift ;;
    --stages=*) STAGES="${1#*=}" ;;
    --python) PY="$2"; shift ;;
    --python=*) PY="${1#*=}" ;;
    -h|--help) sed -n '2,36p' "$0"; exit 0 ;;
    *) echo "gpu_check.sh: unknown argument $1 (see --help)" >&2; exit 2 ;;
  esac
  shift
done
PY="$(command -v "$PY" || echo "$PY")"
OUTDIR="${OUT:-$ROOT/gpu_check_out}"
mkdir -p "$OUTDIR"
OUTDIR="$(cd "$OUTDIR" && pwd)"
LOGS="$(mktemp -d /tmp/vmfdist-gpu-logs.XXXXXX)"
SUMMARY="$OUTDIR/summary.md"
: > "$LOGS/stages.tsv"
T_ALL=$(date +%s)

limit() {  # the time limit of a stage: GPU_CHECK_LIMIT_<STAGE>, else the default given
  local var="GPU_CHECK_LIMIT_$(echo "$1" | tr a-z A-Z)"
  echo "${!var:-$2}"
}

# summary.md, timings.json and logs.tar.gz under $OUTDIR, rewritten after every stage, so that a
# run cut off by the device call's own limit still brings back what it did
write_summary() {
  local TOTAL=$(( $(date +%s) - T_ALL ))
  "$PY" - "$LOGS" "$OUTDIR" "$TOTAL" "$DRY" <<'PYEOF'
import json, os, sys
logs, out, total, dry = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4] == "1"
rows = [l.rstrip("\n").split("\t") for l in open(os.path.join(logs, "stages.tsv")) if l.strip()]
stages = [{"stage": n, "rc": int(rc), "seconds": int(s), "limit": int(lim)} for n, rc, s, lim in rows]
json.dump({"dry_run": dry, "total_seconds": total, "stages": stages}, open(os.path.join(out, "timings.json"), "w"),
          indent=1)
L = [f"# GPU check{' (dry run)' if dry else ''}", "", f"Total {total} s.", "",
     "| stage | result | seconds | limit |", "|---|---|---|---|"]
for s in stages:
    res = ("ok" if s["rc"] == 0 else "TIMED OUT" if s["rc"] in (124, 137) else "SKIPPED (no time left)"
           if s["rc"] == 125 else f"FAILED (rc {s['rc']})")
    L.append(f"| {s['stage']} | {res} | {s['seconds']} | {s['limit']} |")
env = os.path.join(logs, "env.log")
if os.path.exists(env):
    L += ["", "## Environment", "", "```", open(env).read().strip(), "```"]
for s in stages:
    log = os.path.join(logs, s["stage"] + ".log")
    if os.path.exists(log) and (s["rc"] != 0 or s["stage"] in ("test",) or s["stage"].startswith("sanitize")):
        tail = open(log, errors="replace").read().strip().splitlines()[-40:]
        L += ["", f"## {s['stage']} (last lines)", "", "```", *tail, "```"]
bench = os.path.join(out, "bench.md")
if os.path.exists(bench):
    L += ["", open(bench).read()]
open(os.path.join(out, "summary.md"), "w").write("\n".join(L) + "\n")
PYEOF
  tar -czf "$OUTDIR/logs.tar.gz" -C "$LOGS" . 2>/dev/null
}

# the whole run's budget (seconds; the GPU run only): a stage gets at most what is left of it,
# less 20 s for the summary, and is skipped (rc 125) when under 15 s are left
BUDGET="${GPU_CHECK_BUDGET:-$([ "$DRY" = 1 ] && echo 100000 || echo 540)}"
# the torch of the GPU machines' image (device tool, KINDS.md): the dry run against it leaves a
# prebuilt module for them (below)
GPU_MACHINE_TORCH="${GPU_MACHINE_TORCH:-2.11.0+cu130}"

# run_stage NAME LIMIT_S CMD...: runs CMD under `timeout`, logs to $LOGS/NAME.log, records
# NAME, rc and seconds; rc 124/137 means the stage hit its limit.
run_stage() {
  local name="$1" lim="$2"; shift 2
  local t0 rc left
  t0=$(date +%s)
  left=$(( BUDGET - (t0 - T_ALL) - 20 ))
  if [ "$left" -lt 15 ]; then
    echo "=== $name: skipped, ${left}s of the ${BUDGET}s budget left" | tee -a "$LOGS/all.log"
    printf '%s\t125\t0\t0\n' "$name" >> "$LOGS/stages.tsv"
    write_summary
    return 125
  fi
  [ "$lim" -gt "$left" ] && lim=$left
  echo "=== $name (limit ${lim}s): $*" | tee -a "$LOGS/all.log"
  timeout --kill-after=15 "$lim" "$@" > "$LOGS/$name.log" 2>&1
  rc=$?
  local dt=$(( $(date +%s) - t0 ))
  tail -n 5 "$LOGS/$name.log" | sed 's/^/    /'
  echo "=== $name: rc=$rc, ${dt}s" | tee -a "$LOGS/all.log"
  printf '%s\t%s\t%s\t%s\n' "$name" "$rc" "$dt" "$lim" >> "$LOGS/stages.tsv"
  write_summary
  return $rc
}

want() { [[ ",$STAGES," == *",$1,"* ]]; }

# what the compiled module is built from (the same on a git checkout and on a copied tree)
sources_hash() { find csrc setup.py -type f | LC_ALL=C sort | xargs cat | sha256sum | cut -c1-16; }

# ------------------------------------------------------------------------------ where we run
if [ "$DRY" = 1 ]; then
  # one scratch copy per python, kept between rehearsals: rsync keeps the files' times, so a
  # second dry run recompiles only what changed (the first is a clean build, as on the GPU)
  WORK="/tmp/vmfdist-gpu-dry-$(echo "$PY" | sha1sum | cut -c1-8)"
  mkdir -p "$WORK"
  if command -v rsync > /dev/null; then
    (cd "$ROOT" && git ls-files -z --cached --others --exclude-standard | rsync -a --from0 --files-from=- ./ "$WORK/")
  else
    (cd "$ROOT" && git ls-files -z --cached --others --exclude-standard | xargs -0 cp -p --parents -t "$WORK")
  fi
  echo "dry run in $WORK (a copy of the tracked tree), python $PY"
else
  WORK="$ROOT"
fi
cd "$WORK" || exit 2
export PYTHONPATH="$WORK${PYTHONPATH:+:$PYTHONPATH}"
export PYTHONUNBUFFERED=1
NPROC=$(nproc)

# ------------------------------------------------------------------------------ env
stage_env() {
  echo "date: $(date -u +%Y-%m-%dT%H:%M:%SZ)"
  echo "git: $(git -C "$ROOT" describe --always --dirty 2>/dev/null || echo '?')"
  echo "python: $PY ($("$PY" --version 2>&1))"
  command -v nvidia-smi > /dev/null && nvidia-smi --query-gpu=name,driver_version,memory.total,compute_cap \
    --format=csv || echo "nvidia-smi: not found"
  local nvcc="${CUDA_HOME:-/usr/local/cuda}/bin/nvcc"
  [ -x "$nvcc" ] || nvcc="$(command -v nvcc || true)"
  [ -n "$nvcc" ] && "$nvcc" --version | tail -n 2 || echo "nvcc: not found"
  local cs="${CUDA_HOME:-/usr/local/cuda}/bin/compute-sanitizer"
  [ -x "$cs" ] || cs="$(command -v compute-sanitizer || true)"
  echo "compute-sanitizer: ${cs:-not found}"
  if [ "$DRY" = 1 ]; then
    echo "dry run: the carried wheels are for the GPU machine's Python 3.12, not installed here (the wheels stage checks them)"
  elif ls gpu_wheels/*.whl > /dev/null 2>&1; then
    # the peers the machine lacks, carried as wheels (scripts/gpu_wheels.sh); --no-deps: the
    # set is complete (checked by the dry run), and nothing of the image is replaced
    "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
      --target /tmp/vmfdist-gpu-site gpu_wheels/*.whl || return 1
    echo "installed $(ls gpu_wheels/*.whl | wc -l) carried wheels into /tmp/vmfdist-gpu-site"
  else
    echo "no carried wheels (gpu_wheels/ is empty): peers the machine lacks are left out of the benchmarks"
  fi
  "$PY" - <<'PYEOF'
import importlib, torch
print("torch", torch.__version__, "cuda", torch.version.cuda, "gpu available", torch.cuda.is_available())
if torch.cuda.is_available():
    p = torch.cuda.get_device_properties(0)
    print("gpu", p.name, f"sm_{p.major}{p.minor}", f"{p.total_memory / 2**30:.1f} GiB", p.multi_processor_count, "SMs")
for m in ("numpy", "scipy", "mpmath", "hypothesis", "pytest", "jax", "tensorflow_probability", "power_spherical",
          "bayesian_torch", "laplace", "curvlinops", "backpack"):
    try:
        mod = importlib.import_module(m)
        print(f"{m}: {getattr(mod, '__version__', 'present')}")
    except Exception as e:
        print(f"{m}: unavailable ({type(e).__name__}: {str(e)[:120]})")
PYEOF
}
if want env; then
  [ -d /tmp/vmfdist-gpu-site ] && rm -rf /tmp/vmfdist-gpu-site
  run_stage env "$(limit env 60)" bash -c "$(declare -f stage_env); PY='$PY'; ROOT='$ROOT'; DRY='$DRY'; stage_env"
fi
[ -d /tmp/vmfdist-gpu-site ] && export PYTHONPATH="$PYTHONPATH:/tmp/vmfdist-gpu-site"

# ------------------------------------------------------------------------------ build
if [ "$DRY" = 1 ]; then
  ARCH="9.0"
else
  ARCH="$("$PY" -c 'import torch; c = torch.cuda.get_device_capability(); print(f"{c[0]}.{c[1]}")' 2>/dev/null)"
fi
if want build; then
  if [ -z "$ARCH" ]; then
    echo "no GPU visible to torch: nothing to build for (use --dry-run on a machine without a GPU)" | tee -a "$LOGS/all.log"
    printf 'build\t3\t0\t0\n' >> "$LOGS/stages.tsv"
  elif [ "$DRY" = 0 ] && [ -z "${GPU_CHECK_FORCE_BUILD:-}" ] && [ -f gpu_prebuilt/MANIFEST ] && \
       [ "$(cat gpu_prebuilt/MANIFEST)" = "torch=$("$PY" -c 'import torch; print(torch.__version__)' 2>/dev/null) arch=$ARCH sources=$(sources_hash)" ]; then
    # the dry run's module matches this torch, this GPU and these sources: no GPU time on compiling
    # (the first GPU session had 15 minutes; GPU_CHECK_FORCE_BUILD=1 compiles anyway)
    cp gpu_prebuilt/_C*.so vmfdist/
    echo "build: using gpu_prebuilt/ ($(cat gpu_prebuilt/MANIFEST)), nothing compiled" | tee -a "$LOGS/all.log"
    printf 'build-prebuilt\t0\t0\t0\n' >> "$LOGS/stages.tsv"
  else
    export CUDA_HOME="${CUDA_HOME:-/usr/local/cuda}" TORCH_CUDA_ARCH_LIST="$ARCH" MAX_JOBS="$NPROC" VMFDIST_REQUIRE_CUDA=1
    # torch's build runs the first ninja on PATH: the python's own (pip's ninja) when it has one
    PATH="$(dirname "$PY"):$PATH" run_stage build "$(limit build $([ "$DRY" = 1 ] && echo 2400 || echo 240))" \
      "$PY" setup.py -q build_ext --inplace --build-temp build-gpu/temp
    BUILD_RC=$?
    # The fallback: the dry run against the GPU machine's torch (2.11.0+cu130, the same wheel as
    # PyPI's) leaves the extension it built for sm_90 in gpu_prebuilt/, with the torch version,
    # the architecture and a hash of the sources; if the build here fails or runs out of time and
    # all three match, that module is used, so the lease still tests, sanitizes and benchmarks.
    MANIFEST="torch=$("$PY" -c 'import torch; print(torch.__version__)' 2>/dev/null) arch=$ARCH sources=$(sources_hash)"
    if [ "$DRY" = 1 ] && [ "$BUILD_RC" = 0 ] && [[ "$MANIFEST" != "torch=$GPU_MACHINE_TORCH "* ]]; then
      echo "no gpu_prebuilt/ written: this torch is not the GPU machine's ($GPU_MACHINE_TORCH)" | tee -a "$LOGS/all.log"
    elif [ "$DRY" = 1 ] && [ "$BUILD_RC" = 0 ]; then
      mkdir -p "$ROOT/gpu_prebuilt"
      cp vmfdist/_C*.so "$ROOT/gpu_prebuilt/" && strip --strip-debug "$ROOT"/gpu_prebuilt/_C*.so
      echo "$MANIFEST" > "$ROOT/gpu_prebuilt/MANIFEST"
      echo "prebuilt fallback for the GPU machine: $ROOT/gpu_prebuilt ($MANIFEST)" | tee -a "$LOGS/all.log"
    elif [ "$DRY" = 0 ] && [ "$BUILD_RC" != 0 ]; then
      if [ -f gpu_prebuilt/MANIFEST ] && [ "$(cat gpu_prebuilt/MANIFEST)" = "$MANIFEST" ]; then
        cp gpu_prebuilt/_C*.so vmfdist/
        echo "build failed (rc $BUILD_RC): using the carried gpu_prebuilt/ module ($MANIFEST)" | tee -a "$LOGS/all.log"
        printf 'build-fallback\t0\t0\t0\n' >> "$LOGS/stages.tsv"
      else
        echo "build failed (rc $BUILD_RC) and no matching gpu_prebuilt/ (want: $MANIFEST)" | tee -a "$LOGS/all.log"
      fi
    fi
  fi
fi

# ------------------------------------------------------------------------------ test
if want test; then
  if [ "$DRY" = 1 ]; then
    run_stage test "$(limit test 300)" "$PY" -m pytest -q -p no:cacheprovider --collect-only -m cuda tests
  else
    # pytest-xdist (in the GPU image): eight processes share the GPU, most tests being launch-bound
    XDIST=$("$PY" -c 'import xdist' 2>/dev/null && echo "-n 8" || echo "")
    VMFDIST_REQUIRE_GPU=1 run_stage test "$(limit test 300)" "$PY" -m pytest -q -p no:cacheprovider -m cuda $XDIST \
      -o junit_family=xunit2 --junitxml="$LOGS/tests.xml" --maxfail=50 tests
  fi
fi

# ------------------------------------------------------------------------------ sanitize
if want sanitize; then
  if [ "$DRY" = 1 ]; then
    run_stage sanitize "$(limit sanitize 300)" "$PY" scripts/gpu_kernels.py --device cpu
  else
    CS="${CUDA_HOME:-/usr/local/cuda}/bin/compute-sanitizer"
    [ -x "$CS" ] || CS="$(command -v compute-sanitizer || echo compute-sanitizer)"
    FILTER=(--kernel-name kns=vmfdist)  # only the kernels of vmfdist (their names hold the namespace)
    sanitize() {  # sanitize TOOL: one compute-sanitizer run over the driver, as a stage
      # memcheck and initcheck without the caching allocator, so that a read past a tensor's end is
      # past an allocation's end too, and no allocation comes back already written.  initcheck
      # without the kernel filter: it only sees the writes of the kernels it instruments, so
      # filtered it reports every read of memory that torch's kernels or cuBLAS wrote (the first
      # GPU session's "uninitialized reads", docs/install.md) -- unfiltered it checks torch's too
      local f=("${FILTER[@]}") nocache=0
      [ "$1" = initcheck ] && f=()
      { [ "$1" = memcheck ] || [ "$1" = initcheck ]; } && nocache=1
      PYTORCH_NO_CUDA_MEMORY_CACHING=$nocache \
        run_stage "sanitize-$1" "$(limit sanitize "$([ "$1" = initcheck ] && echo 120 || echo 45)")" "$CS" --tool "$1" "${f[@]}" \
        --error-exitcode 99 --print-limit 20 "$PY" scripts/gpu_kernels.py --sizes 0 1 3 37 1031
    }
    for tool in memcheck racecheck synccheck initcheck; do
      sanitize "$tool"
      if [ ${#FILTER[@]} -gt 0 ] && grep -qiE "unrecognized|unknown option|invalid option" "$LOGS/sanitize-$tool.log"; then
        # a compute-sanitizer without the kernel filter: check every kernel (torch's too)
        mv "$LOGS/sanitize-$tool.log" "$LOGS/sanitize-$tool-filter-refused.log"
        sed -i '$ d' "$LOGS/stages.tsv"  # that attempt does not count
        FILTER=()
        sanitize "$tool"
      fi
    done
  fi
fi

# ------------------------------------------------------------------------------ bench
if want bench; then
  if [ "$DRY" = 1 ]; then
    run_stage bench "$(limit bench 420)" "$PY" -m benchmarks.run gpu --device cpu --quick --out "$LOGS/bench"
  else
    # GPU_CHECK_BENCH_ARGS: more options for the benchmark, e.g. "--rounds 5 --lenet-steps 100"
    run_stage bench "$(limit bench 240)" "$PY" -m benchmarks.run gpu --threads "$NPROC" --out "$LOGS/bench" \
      ${GPU_CHECK_BENCH_ARGS:-}
  fi
  [ -f "$LOGS/bench/gpu.md" ] && cp "$LOGS/bench/gpu.md" "$OUTDIR/bench.md"
  if [ -f "$LOGS/bench/gpu.json" ]; then cp "$LOGS/bench/gpu.json" "$OUTDIR/bench.json"
  elif [ -f "$LOGS/bench/gpu.partial.json" ]; then cp "$LOGS/bench/gpu.partial.json" "$OUTDIR/bench.json"; fi
fi

# ------------------------------------------------------------------------------ wheels (dry run)
if [ "$DRY" = 1 ]; then
  run_stage wheels "$(limit wheels 60)" bash "$ROOT/scripts/gpu_wheels.sh" --check
fi

# ------------------------------------------------------------------------------ summary
TOTAL=$(( $(date +%s) - T_ALL ))
write_summary
echo "summary: $SUMMARY (total ${TOTAL}s); logs: $OUTDIR/logs.tar.gz"
FAILED=$(awk -F'\t' '$2 != 0' "$LOGS/stages.tsv" | wc -l)
if [ "$DRY" = 1 ]; then
  cat <<EOF

The command to give the GPU machine (device tool: run, carry ["gpu_wheels", "gpu_prebuilt"], timeout_s 600):

    bash scripts/gpu_check.sh

It writes summary.md, timings.json, bench.md, bench.json and logs.tar.gz under \$OUT.
EOF
fi
[ "$FAILED" = 0 ]
