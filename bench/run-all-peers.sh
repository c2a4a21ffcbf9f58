#!/usr/bin/env bash
# Every benchmark table and chart of docs/benchmarks.md, in one command on a GPU
# machine (no network needed): builds gpumem-bench with the RMM peers (from the
# wheels in .whl/) and the PyTorch peers (from the installed torch package),
# builds gpumem's Python package, records real allocation logs (W5), runs
# gpumem-bench's workloads with --json and --plot, runs the Python peers
# (CuPy, PyTorch, RMM, Numba), and prints every table.
#
#   bench/run-all-peers.sh OUT_DIR [WORK_DIR]
#
# Everything it makes goes under OUT_DIR: logs, JSON, charts, recorded traces,
# tables.txt and summary.txt (what ran, what failed and why, how long each part
# took); the builds and the unpacked wheels go to WORK_DIR (default OUT_DIR/work,
# a few hundred MB: give another folder to keep OUT_DIR small). Each part
# goes on when another fails, and the run keeps to a time budget (RUN_BUDGET_S,
# default 530 s, under 9 minutes): a part gets its planned share plus what earlier
# parts left, and gpumem-bench is told its share (--time-limit-s) so that it
# always writes its tables and charts. Exit status: 0 when every part succeeded,
# 1 otherwise (the summary lists the parts that did not).
#
# PARTS="versions W3 W6 W8" runs only the named parts (see `parts` below), reusing what
# an earlier run left in WORK_DIR: a way to split the set over runs with time limits.
#
# For a dry run of the script itself where there is no GPU: BENCH_BACKEND=sim runs
# gpumem-bench on the simulator, BENCH_QUICK=1 makes every measurement short.
set -uo pipefail

out="${1:?usage: bench/run-all-peers.sh OUT_DIR [WORK_DIR]}"
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
mkdir -p "$out"
out="$(cd "$out" && pwd)"
work="${2:-$out/work}"
mkdir -p "$work"
work="$(cd "$work" && pwd)"
logs="$out/logs"
mkdir -p "$logs" "$out/bench" "$out/plots" "$out/traces" "$out/python"
jobs="${JOBS:-$(nproc)}"
budget="${RUN_BUDGET_S:-530}"
start=$(date +%s)
deadline=$((start + budget))
summary="$out/summary.txt"
: >"$summary"
failures=()

# Planned seconds per part, in order; a part may use what earlier parts left.
parts=(versions unpack build build-rmm build-torch build-python trace-torch trace-pipeline W1 W2 W3 W4 W5 W6 W8 python)
declare -A plan=([versions]=5 [unpack]=10 [build]=110 [build-rmm]=20 [build-torch]=30 [build-python]=30
                 [trace-torch]=30 [trace-pipeline]=20 [W1]=25 [W2]=30 [W3]=70 [W4]=25 [W5]=40 [W6]=30
                 [W8]=40 [python]=85)
# PARTS="W3 W6 W8": run only those parts (a later run over the same WORK_DIR reuses its
# builds), so that the whole set can be split over runs that each fit a time limit.
# Empty: every part.
only=" ${PARTS:-${parts[*]}} "
selected() { [[ "$only" == *" $1 "* ]]; }

# Seconds the part may take now: the time left, less what later parts are promised.
allowance() {
  local name="$1" later=0 seen=0 p
  for p in "${parts[@]}"; do
    if [ "$seen" = 1 ] && selected "$p"; then later=$((later + plan[$p])); fi
    [ "$p" = "$name" ] && seen=1
  done
  local left=$((deadline - $(date +%s) - later))
  [ "$left" -lt 10 ] && left=10
  echo "$left"
}

# part NAME CMD...: runs CMD with the part's allowance as a timeout, its output in
# logs/NAME.log (and on the terminal), and records how it went.
part() {
  local name="$1"; shift
  selected "$name" || return 0
  local allowed; allowed=$(allowance "$name")
  local t0; t0=$(date +%s)
  echo "== $name (up to ${allowed} s)" >&2
  # Through bash, so that CMD may be one of the functions below (exported).
  PART_ALLOWED="$allowed" timeout --kill-after=10 "$allowed" bash -c '"$@"' part "$@" 2>&1 | tee "$logs/$name.log"
  local rc=${PIPESTATUS[0]}
  local took=$(( $(date +%s) - t0 ))
  local verdict="ok"
  if [ "$rc" = 124 ] || [ "$rc" = 137 ]; then verdict="TIMED OUT after ${allowed} s"
  elif [ "$rc" != 0 ]; then verdict="FAILED (exit $rc)"; fi
  printf '%-15s %-28s %4d s  log: logs/%s.log\n' "$name" "$verdict" "$took" "$name" >>"$summary"
  [ "$verdict" = ok ] || failures+=("$name: $verdict")
  return "$rc"
}

# The parts run in child shells: they see these.
export root out work logs jobs

# ---- what the run is measured on ------------------------------------------------
versions() {
  echo "date: $(date -u +%Y-%m-%dT%H:%M:%SZ)"
  echo "git: $(git -C "$root" rev-parse --short HEAD 2>/dev/null)$(git -C "$root" diff --quiet 2>/dev/null || echo ' (with local changes)')"
  nvidia-smi --query-gpu=name,driver_version,memory.total,compute_cap --format=csv,noheader || true
  nvcc --version 2>/dev/null | tail -n 2 || echo "nvcc: none"
  echo "cmake: $(cmake --version | head -n 1)"
  echo "c++: $(c++ --version | head -n 1)"
  python3 - <<'EOF'
import importlib, platform
print("python:", platform.python_version())
for m in ("numpy", "numba", "numba_cuda", "cupy", "torch", "cuda.bindings"):
    try:
        mod = importlib.import_module(m)
        print("%s: %s" % (m, getattr(mod, "__version__", "?")))
    except Exception as e:
        print("%s: not importable (%s)" % (m, str(e).splitlines()[0] if str(e) else type(e).__name__))
EOF
  ls "$root/.whl" 2>/dev/null | sed 's/^/wheel: /'
}
export -f versions
part versions versions >"$out/versions.txt" 2>&1
cat "$out/versions.txt"

# ---- builds -----------------------------------------------------------------------
wheels="$work/peer-wheels"
part unpack "$root/bench/peers/wheels.sh" unpack "$wheels"

cuda_include=""
for d in "${CUDA_HOME:-/nonexistent}/include" /usr/local/cuda/include; do
  if [ -f "$d/cuda.h" ]; then cuda_include="$d"; break; fi
done
if [ -z "$cuda_include" ] && command -v nvcc >/dev/null; then cuda_include="$(dirname "$(command -v nvcc)")/../include"; fi

build="$work/build"
export wheels cuda_include build
build_all() {
  cmake -S "$root" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release \
    -DGPUMEM_CUDA_INCLUDE_DIR="$cuda_include" -DGPUMEM_BUILD_TESTS=OFF -DGPUMEM_CUDA_KERNELS=OFF \
    -DGPUMEM_RMM_ROOT="$wheels" -DGPUMEM_BENCH_TORCH=AUTO &&
  cmake --build "$build" --parallel "$jobs" --target gpumem-bench gpumem-replay gpumem-report
}
export -f build_all
part build build_all
part build-rmm cmake --build "$build" --parallel "$jobs" --target gpumem-bench-rmm
part build-torch cmake --build "$build" --parallel "$jobs" --target gpumem-bench-torch

# gpumem's Python package, built with CMake (nanobind from the wheels: no pip, no network).
pyroot="$work/python-gpumem"
build_python() {
  cmake -S "$root" -B "$work/build-python" -G Ninja -DCMAKE_BUILD_TYPE=Release \
    -DGPUMEM_CUDA_INCLUDE_DIR="$cuda_include" -DGPUMEM_BUILD_PYTHON=ON -DGPUMEM_BUILD_TESTS=OFF \
    -DGPUMEM_BUILD_BENCH=OFF -DGPUMEM_BUILD_TOOLS=OFF -DGPUMEM_CUDA_KERNELS=OFF \
    -Dnanobind_ROOT="$wheels/nanobind/cmake" -DPython_EXECUTABLE="$(command -v python3)" &&
  cmake --build "$work/build-python" --parallel "$jobs" &&
  cmake --install "$work/build-python" --component python --prefix "$pyroot" &&
  cp "$root"/python/gpumem/*.py "$pyroot/gpumem/" &&
  PYTHONPATH="$pyroot" python3 -c "import gpumem; print('gpumem', gpumem.__version__, 'importable')"
}
export pyroot
export -f build_python
part build-python build_python
# gpumem's package first; the unpacked wheels (rmm for the Python peers) after.
export PYTHONPATH="$pyroot:$wheels${PYTHONPATH:+:$PYTHONPATH}"

# ---- W5's logs, recorded here ---------------------------------------------------------
part trace-torch python3 "$root/bench/traces/record_torch.py" "$out/traces/torch-train-gpu.csv"
part trace-pipeline python3 "$root/bench/traces/record_pipeline.py" "$out/traces/cupy-numba-pipeline-gpu.csv"
for f in "$out"/traces/*.csv; do
  [ -f "$f" ] && echo "$(basename "$f"): $(($(wc -l <"$f") - 1)) rows" >>"$summary"
done

# ---- gpumem-bench, one process per workload (a crash costs one table) -----------------
bench="$build/bench/gpumem-bench"
run_bench() {
  local w="$1"; shift
  local allowed="${PART_ALLOWED:-600}"
  # Its own limit a little under the part's, so that it writes what it has.
  local limit=$((allowed > 40 ? allowed - 15 : allowed * 2 / 3))
  local quick=()
  [ "${BENCH_QUICK:-0}" = 1 ] && quick=(--quick)
  GPUMEM_BACKEND="${BENCH_BACKEND:-cuda}" "$bench" --workloads "$w" --json "$out/bench/$w.json" \
    --plot "$out/plots" --time-limit-s "$limit" "${quick[@]}" "$@"
}
export bench
export -f run_bench
if [ -x "$bench" ]; then
  part W1 run_bench W1 --rep-ms 50
  part W2 run_bench W2 --cell-budget-s 5
  part W3 run_bench W3 --cell-budget-s 5
  part W4 run_bench W4
  part W5 run_bench W5 --cell-budget-s 5 --traces "$root/bench/traces,$out/traces"
  part W6 run_bench W6 --cell-budget-s 8
  part W8 run_bench W8 --cell-budget-s 5
else
  for w in W1 W2 W3 W4 W5 W6 W8; do
    selected "$w" && failures+=("$w: not run, gpumem-bench was not built")
  done
fi

# ---- the peers from Python ---------------------------------------------------------
python_quick=()
[ "${BENCH_QUICK:-0}" = 1 ] && python_quick=(--quick)
part python python3 "$root/bench/python/peers.py" --reps 3 --rep-ms 50 --cell-budget-s 5 \
  --row-timeout-s 60 --json "$out/python/peers.json" "${python_quick[@]}"

# ---- all tables, then the summary --------------------------------------------------
{
  echo
  echo "######## tables ########"
  cat "$out/versions.txt"
  header_printed=0
  for w in W1 W2 W3 W4 W5 W6 W8; do
    [ -f "$logs/$w.log" ] || continue
    if [ "$header_printed" = 0 ] && grep -q '^gpumem-bench [0-9]' "$logs/$w.log"; then
      sed -n '/^gpumem-bench [0-9]/,$p' "$logs/$w.log"  # the run's header once: device, driver, peers
      header_printed=1
    else
      sed -n '/^W[0-9] /,$p' "$logs/$w.log"
    fi
  done
  [ -f "$logs/python.log" ] && cat "$logs/python.log"
} | tee "$out/tables.txt"

{
  echo
  echo "charts: $(ls "$out"/plots/*.svg 2>/dev/null | wc -l) in plots/"
  echo "total: $(( $(date +%s) - start )) s (budget ${budget} s)"
  if [ ${#failures[@]} -gt 0 ]; then
    echo "parts that did not succeed:"
    printf '  %s\n' "${failures[@]}"
  else
    echo "every part succeeded"
  fi
} >>"$summary"
echo
echo "######## summary ($out/summary.txt) ########"
cat "$summary"
[ ${#failures[@]} -eq 0 ]
