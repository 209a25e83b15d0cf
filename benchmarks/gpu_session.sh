#!/usr/bin/env bash
# One device call's worth of GPU checks and measurements, run from the repository root:
#
#   bash benchmarks/gpu_session.sh                                 # tests vectors bench sanitizer
#   bash benchmarks/gpu_session.sh tests vectors memcheck bench    # one command, about 5 minutes
#   AB_ROUNDS=3 bash benchmarks/gpu_session.sh ab abpublic abcpu   # the A/B protocol (old tree in .base/)
#
# Each step is bounded with `timeout` (LIMIT_<step>=s overrides), logged to $OUT/<step>.log; the run goes
# on when one fails and $OUT/summary.txt lists the exit codes. $OUT defaults to ./gpu-out; PACK=file.tgz
# also packs $OUT into one archive after every step (for a device tool that brings back only a few files).
#
# Steps:
#   tests      the gpu tier and the kernel (simulator-marked) tests on the GPU
#   subset     the same tier restricted to TEST_FILES (a space-separated list; one call's share)
#   split      the same tier as `tests`, its files dealt into SPLIT_GROUPS (default 3) pytest processes that share
#              the GPU at once (the tier is mostly compile and host time) -> split-<n>.log, split-<n>.xml
#   cu12       the GPU tier under CUDA 12: the wheels carried in parts to /tmp/cu12 (see
#              benchmarks/fetch_cu12_wheels.sh) checked and installed into a fresh virtual environment,
#              /tmp/venv-cu12, that sees the image's test stack but not its CUDA 13 libraries, PyTorch or
#              JAX (benchmarks/cu12_site.py); then `kvcanary doctor`, where each CUDA library was loaded
#              from, and the `split` tier -> cu12-doctor.log, cu12/split-*.log, .xml
#   vectors    golden-vector replay on the GPU ($KVCANARY_VECTORS, else the committed ./tests/data/vectors)
#   bench      the full benchmark: JSON, markdown and PNG plots (about 60 s; BENCH_BUDGET=s bounds its wall
#              clock, default 330; pinned to core BENCH_PIN, default 3, empty: not pinned; BENCH_ONLY=sections)
#   quick      the benchmark at small sizes: a smoke test of every section
#   sanitizer  compute-sanitizer memcheck of benchmarks/sanitizer_check.py (expect 0 errors)
#   memcheck   every kernel test, small and at scale, under memcheck (MEMCHECK_FILES=subset)
#   racecheck  the small kernel tests under racecheck (shared-memory hazards; RACE_TESTS=subset)
#   fuzz       the bad-input harness on CuPy arrays under memcheck (benchmarks/fuzz_cuda.py; copy
#              ../shared/tools/fuzz_bad_inputs.py to ./.fuzz/ first)
#   replays    the launch-replay, prepared-step and interop GPU tests with every replay verified against
#              a fresh run of the glue (pytest plugin benchmarks/verify_replays.py)
#   ab         the monitor step, old tree against this one (benchmarks/ab_monitor.py: decode prepared and
#              graph replay, bench and idle protocols, prefill 8 x 8k prepared): AB_ROUNDS rounds (default 3),
#              order alternated per round, each process pinned to core AB_PIN (default 3); AB_ARGS: more
#              arguments of every A/B script -> $OUT/ab-monitor.jsonl and the table ab-monitor.md
#   abpublic   the public CuPy calls' host time, likewise (benchmarks/ab_public.py) -> $OUT/ab-public.jsonl, .md;
#              AB_PROFILE=1 adds a profiled verify of this tree
#   abcpu      the public NumPy calls and the CPU monitor step, likewise (benchmarks/ab_cpu.py, pinned to
#              AB_CPU_PIN, default 3, with NUMBA_NUM_THREADS=AB_CPU_THREADS, default 1) -> $OUT/ab-cpu.jsonl, .md;
#              and, when .base/ has benchmarks/host_step.py, each tree's own host-step benchmark
#              (HOST_STEP_ARGS, default "--driver fake") -> $OUT/ab-host-step.txt
#   monitortests  the GPU tests of the monitor, its prepared steps and graph replay, and the toy engine
#   interop    the GPU tests of every array library, of the validation memo and of launch scratch during a
#              real CUDA-graph capture
#   moves      the moved-records benchmark (benchmarks/bench_moves.py) of this tree, and when .base/ is present, the
#              same script on .base/'s package (only the package differs) -> $OUT/moves.md, .json, moves-base.md, .json (LIMIT_moves_base;
#              MOVES_ARGS: more arguments of both, e.g. --gpu)
#   ptx        registers, stack and spills of every kernel's sm_90 build (benchmarks/ptx_report.py), of this
#              tree and, when present, of .base/ side by side -> $OUT/ptx.md, ptx.jsonl
#
# The A/B steps measure the old tree in .base/ (ignored by git: carry it to the device). Make it with
#   mkdir -p .base && git archive 9f4649c kvcanary_numba benchmarks | tar -x -C .base
# (the A/B scripts need only its kvcanary_numba; abcpu's host-step rows its benchmarks/ too). Medians,
# spread across rounds and the verdict per row: python3 benchmarks/ab_table.py $OUT/ab-monitor.jsonl.
SITE=${SITE:-/tmp/site}  # where carried wheels are installed (the cu12 step: its virtual environment)
[ -d .whl ] && [ "$SITE" = /tmp/site ] && python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl
export PYTHONPATH=$SITE:$PWD
set -u
OUT=${OUT:-$PWD/gpu-out}
export OUT
mkdir -p "$OUT"
export NUMBA_ENABLE_CUDASIM=0 PYTHONUNBUFFERED=1
# A hung step leaves a stack in its log: SIGABRT at its limit makes Python's faulthandler dump every
# thread (the step still reads rc=124), and a pytest test running longer than HANG_DUMP_S dumps too.
export PYTHONFAULTHANDLER=1 PYTEST_ADDOPTS="${PYTEST_ADDOPTS:-} -o faulthandler_timeout=${HANG_DUMP_S:-120}"
STEPS=("$@")
[ ${#STEPS[@]} -eq 0 ] && STEPS=(tests vectors bench sanitizer)
SUMMARY="$OUT/summary.txt"
echo "gpu_session $(date -u +%FT%TZ) steps: ${STEPS[*]}" >>"$SUMMARY"

run_step() {  # name, limit in seconds, command...
    local name=$1 limit=$2 start rc override="LIMIT_$1"
    limit=${!override:-$limit}  # e.g. LIMIT_tests=300: fit several steps into one device call
    shift 2
    echo "=== $name (limit ${limit}s): $*"
    start=$(date +%s)
    timeout --signal=ABRT --kill-after=15 "$limit" "$@" >"$OUT/$name.log" 2>&1
    rc=$?
    [ $rc -eq 124 ] && echo "(timed out after ${limit}s)" >>"$OUT/$name.log"
    printf '%-12s rc=%-4s %4ss\n' "$name" "$rc" "$(($(date +%s) - start))" | tee -a "$SUMMARY"
    tail -n 6 "$OUT/$name.log"
    # Packed after every step: a call cut by the device tool's limit still brings back what ran.
    [ -n "${PACK:-}" ] && tar czf "$PACK" -C "$OUT" . 2>/dev/null
    return 0
}

find_vectors() {
    for dir in "${KVCANARY_VECTORS:-}" "$PWD/tests/data/vectors"; do
        [ -n "$dir" ] && ls "$dir"/*.npz >/dev/null 2>&1 && { echo "$dir"; return 0; }
    done
    return 1
}

find_sanitizer() {
    command -v compute-sanitizer && return 0
    timeout 30 find /usr/local /opt /usr/lib "$(python3 -c 'import sys; print(sys.prefix)')" /tmp/site \
        -maxdepth 6 -name compute-sanitizer -type f -perm -u+x 2>/dev/null | head -n 1 | grep . && return 0
    return 1
}

have_base() {  # the old tree of the A/B steps
    [ -d .base/kvcanary_numba ] && return 0
    echo "$1 rc=NA   no old tree in .base/ (mkdir -p .base && git archive REV kvcanary_numba benchmarks | tar -x -C .base)" |
        tee -a "$SUMMARY"
    return 1
}

# ab_rounds SCRIPT JSONL PIN [ARGS...]: AB_ROUNDS rounds of the old tree and this one, order alternated per
# round, each process pinned; a process that fails leaves a {"failed": true} line.
ab_rounds() {
    local script=$1 jsonl=$2 pin=$3 r t order
    shift 3
    : >"$jsonl"
    for r in $(seq "${AB_ROUNDS:-3}"); do
        order=". .base"
        [ $((r % 2)) -eq 1 ] && order=".base ."
        for t in $order; do
            # shellcheck disable=SC2086  # AB_ARGS: extra arguments of the script, e.g. "--steps 500"
            taskset -c "$pin" python3 "$script" "$t" "$t (round $r)" "$@" ${AB_ARGS:-} >>"$jsonl" ||
                echo "{\"tree\": \"$t\", \"label\": \"$t (round $r)\", \"failed\": true}" >>"$jsonl"
        done
    done
    python3 benchmarks/ab_table.py --processes "$jsonl" >"${jsonl%.jsonl}.md"
    cat "${jsonl%.jsonl}.md"
    ! grep -q '"failed": true' "$jsonl"  # the step's exit status: 1 when a process failed
}
export -f ab_rounds

KERNEL_TESTS=${KERNEL_TESTS:-"tests/test_kernels_plan.py tests/test_kernels_plan_scale.py tests/test_kernels_verify.py
    tests/test_kernels_verify_plans.py tests/test_kernels_write.py tests/test_kernels_write_scenarios.py
    tests/test_kernels_fingerprint.py tests/test_kernels_scatter.py tests/test_kernels_shapes.py
    tests/test_kernels_write_share.py tests/test_kernels_chain.py tests/test_kernels_write_tiled.py
    tests/test_kernels_endpoints.py tests/test_kernels_tiled_endpoints.py tests/test_kernels_translate.py
    tests/test_monitor_budget.py tests/test_kernels_moves.py"}
RACE_TESTS=${RACE_TESTS:-"tests/test_kernels_verify.py tests/test_kernels_verify_plans.py tests/test_kernels_write.py
    tests/test_kernels_write_scenarios.py tests/test_kernels_plan.py tests/test_kernels_plan_scale.py
    tests/test_kernels_shapes.py tests/test_kernels_write_share.py tests/test_kernels_write_tiled.py
    tests/test_kernels_endpoints.py tests/test_kernels_tiled_endpoints.py tests/test_kernels_moves.py"}

nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv >"$OUT/nvidia-smi.txt" 2>&1
for step in "${STEPS[@]}"; do
    case $step in
    tests)
        # gpu tests at scale, and the kernel tests (simulator-marked) on the real GPU; the docs
        # tests need mkdocs/nbformat, which the GPU image lacks.
        run_step tests 420 python3 -m pytest -m "gpu or simulator" -q -p no:cacheprovider \
            --ignore=tests/test_vectors.py --ignore=tests/test_notebooks.py --ignore=tests/test_docs.py \
            --ignore=tests/test_docs_browser.py --ignore=tests/test_ptx.py --junitxml="$OUT/tests.xml" \
            -rfE --durations=20 tests ;;
    subset)
        # shellcheck disable=SC2086  # TEST_FILES: a space-separated list
        run_step subset 420 python3 -m pytest -m "gpu or simulator" -q -p no:cacheprovider -rfE --durations=20 \
            --junitxml="$OUT/subset.xml" ${TEST_FILES:?TEST_FILES names the test files} ;;
    split)
        run_step split 560 bash -c 'files=$(ls tests/test_*.py | grep -v -e test_vectors.py -e test_notebooks.py \
            -e test_docs -e test_ptx.py); n=${SPLIT_GROUPS:-3}; pids=""
            for g in $(seq 0 $((n - 1))); do
                group=$(echo "$files" | awk -v n="$n" -v g="$g" "NR % n == g")
                # shellcheck disable=SC2086
                python3 -m pytest -m "gpu or simulator" -q -p no:cacheprovider -rfE --durations=15 \
                    --junitxml="$OUT/split-$g.xml" $group >"$OUT/split-$g.log" 2>&1 & pids="$pids $!"
            done
            rc=0; for p in $pids; do wait "$p" || rc=1; done
            for g in $(seq 0 $((n - 1))); do echo "--- group $g"; tail -n 25 "$OUT/split-$g.log"; done; exit $rc' ;;
    cu12)
        # A fresh virtual environment holds the CUDA 12 wheels; benchmarks/cu12_site.py appends the image's
        # site-packages (numba, pytest) behind them and hides its CUDA 13 PyTorch and JAX.
        if [ -f /tmp/cu12/SHA256SUMS ] && (cd /tmp/cu12 && sha256sum -c --quiet SHA256SUMS); then
            image_site=$(python3 -c 'import site; print(site.getsitepackages()[0])')
            rm -rf /tmp/cu12-wheels /tmp/venv-cu12 && mkdir -p /tmp/cu12-wheels
            cat /tmp/cu12/part-* | tar -xf - -C /tmp/cu12-wheels
            python3 -m venv --without-pip /tmp/venv-cu12
            venv_site=$(/tmp/venv-cu12/bin/python3 -c 'import site; print(site.getsitepackages()[0])')
            python3 -m pip install -q --no-index --no-deps --no-compile --target "$venv_site" /tmp/cu12-wheels/*.whl
            cp benchmarks/cu12_site.py "$venv_site/" && echo "import cu12_site" >"$venv_site/cu12_site.pth"
            # The image's cupy-cuda13x metadata stays visible beside the environment's cupy-cuda12x, so CuPy
            # warns of two installs at import (the tests' warnings-as-errors would turn that into "no GPU").
            # The environment's CuPy is the one imported: the doctor log below prints its path and runtime.
            cupy_twice="ignore::UserWarning:cupy._environment"
            cu12_env=(env KVCANARY_IMAGE_SITE="$image_site" PATH="/tmp/venv-cu12/bin:$PATH"
                PYTHONWARNINGS="$cupy_twice" PYTEST_ADDOPTS="-W $cupy_twice")
            "${cu12_env[@]}" PYTHONPATH="$PWD" python3 -m kvcanary_numba doctor >"$OUT/cu12-doctor.log" 2>&1
            "${cu12_env[@]}" PYTHONPATH="$PWD" python3 -c 'from cuda import pathfinder as p; import numba_cuda, cupy
for lib in ("nvrtc", "nvvm", "cudart"): print(lib, p.load_nvidia_dynamic_lib(lib).abs_path)
print("numba-cuda", numba_cuda.__file__); print("cupy", cupy.__file__, cupy.cuda.runtime.runtimeGetVersion())' \
                >>"$OUT/cu12-doctor.log" 2>&1
            cat "$OUT/cu12-doctor.log"
            "${cu12_env[@]}" OUT="$OUT/cu12" SITE="$venv_site" bash "$0" split
        else
            echo "cu12         rc=NA   no complete set of parts in /tmp/cu12 (benchmarks/fetch_cu12_wheels.sh --parts)" |
                tee -a "$SUMMARY"
        fi ;;
    vectors)
        if dir=$(find_vectors); then
            export KVCANARY_VECTORS=$dir
            run_step vectors 240 python3 -m pytest -q -p no:cacheprovider -m gpu \
                --junitxml="$OUT/vectors.xml" tests/test_vectors.py
        else
            echo "vectors      rc=NA   golden vectors not found (set KVCANARY_VECTORS)" | tee -a "$SUMMARY"
        fi ;;
    bench)
        pin=${BENCH_PIN-3}
        run_step bench 390 python3 benchmarks/run.py --out "$OUT/bench" --budget "${BENCH_BUDGET:-330}" \
            ${pin:+--pin "$pin"} ${BENCH_ONLY:+--only "$BENCH_ONLY"} ;;
    quick)
        run_step quick 240 python3 benchmarks/run.py --quick --out "$OUT/quick" --budget 200 ;;
    sanitizer)
        if tool=$(find_sanitizer); then
            run_step sanitizer 300 "$tool" --tool memcheck --report-api-errors no --error-exitcode 3 --print-limit 20 \
                python3 benchmarks/sanitizer_check.py
            grep -h "ERROR SUMMARY" "$OUT/sanitizer.log" | tee -a "$SUMMARY"
        else
            echo "sanitizer    rc=NA   compute-sanitizer not found" | tee -a "$SUMMARY"
            run_step sanitizer_plain 120 python3 benchmarks/sanitizer_check.py
        fi ;;
    memcheck)
        if tool=$(find_sanitizer); then
            # shellcheck disable=SC2086  # MEMCHECK_FILES: a space-separated subset (one call's share)
            run_step memcheck 420 "$tool" --tool memcheck --report-api-errors no --error-exitcode 3 \
                --print-limit 20 python3 -m pytest -m "gpu or simulator" -q -p no:cacheprovider \
                ${MEMCHECK_FILES:-$KERNEL_TESTS}
            grep -h "ERROR SUMMARY" "$OUT/memcheck.log" | tee -a "$SUMMARY"
        else
            echo "memcheck     rc=NA   compute-sanitizer not found" | tee -a "$SUMMARY"
        fi ;;
    racecheck)
        if tool=$(find_sanitizer); then
            # shellcheck disable=SC2086
            run_step racecheck 420 "$tool" --tool racecheck --racecheck-report hazard --error-exitcode 3 \
                --print-limit 20 python3 -m pytest -m simulator -q -p no:cacheprovider $RACE_TESTS
            grep -h "RACECHECK SUMMARY\|ERROR SUMMARY" "$OUT/racecheck.log" | tee -a "$SUMMARY"
        else
            echo "racecheck    rc=NA   compute-sanitizer not found" | tee -a "$SUMMARY"
        fi ;;
    fuzz)
        harness=""
        for f in "$PWD/.fuzz/fuzz_bad_inputs.py" "$PWD/../shared/tools/fuzz_bad_inputs.py"; do
            [ -f "$f" ] && { harness=$f; break; }
        done
        if [ -z "$harness" ]; then
            echo "fuzz         rc=NA   harness not found (copy fuzz_bad_inputs.py to .fuzz/)" | tee -a "$SUMMARY"
        elif tool=$(find_sanitizer); then
            run_step fuzz 540 "$tool" --tool memcheck --report-api-errors no --error-exitcode 3 --print-limit 20 \
                python3 benchmarks/fuzz_cuda.py --harness "$harness" --n 400 --json "$OUT/fuzz-cuda.json"
            grep -h "ERROR SUMMARY" "$OUT/fuzz.log" | tee -a "$SUMMARY"
        else
            run_step fuzz 300 python3 benchmarks/fuzz_cuda.py --harness "$harness" --n 400 --json "$OUT/fuzz-cuda.json"
        fi ;;
    replays)
        run_step replays 240 python3 -m pytest -p benchmarks.verify_replays -m gpu -q -p no:cacheprovider \
            tests/test_prepared.py tests/test_prepared_fastpath.py tests/test_launch_replay.py \
            tests/test_launch_driver.py tests/test_monitor_host_step.py tests/test_gpu_interop.py \
            tests/test_monitor_endpoints.py tests/test_write_tiled_replay.py ;;
    ab)
        have_base ab && run_step ab 540 bash -c 'ab_rounds benchmarks/ab_monitor.py "$OUT/ab-monitor.jsonl" "${AB_PIN:-3}"' ;;
    abpublic)
        if have_base abpublic; then
            run_step abpublic 360 bash -c 'ab_rounds benchmarks/ab_public.py "$OUT/ab-public.jsonl" "${AB_PIN:-3}" &&
                if [ -n "${AB_PROFILE:-}" ]; then taskset -c "${AB_PIN:-3}" python3 benchmarks/ab_public.py . \
                    "./profiled" --profile >"$OUT/ab-public-profile.json"; fi'
        fi ;;
    abcpu)
        if have_base abcpu; then
            run_step abcpu 420 env NUMBA_NUM_THREADS="${AB_CPU_THREADS:-1}" bash -c \
                'ab_rounds benchmarks/ab_cpu.py "$OUT/ab-cpu.jsonl" "${AB_CPU_PIN:-3}"
                if [ -f .base/benchmarks/host_step.py ]; then
                    for r in $(seq "${AB_ROUNDS:-3}"); do order=". .base"; [ $((r % 2)) -eq 1 ] && order=".base ."
                        for t in $order; do echo "### $t (round $r)"; (cd "$t" && NUMBA_ENABLE_CUDASIM=1 \
                            PYTHONPATH="$PWD:/tmp/site" taskset -c "${AB_CPU_PIN:-3}" python3 -m benchmarks.host_step \
                            ${HOST_STEP_ARGS:---driver fake}) 2>&1 | tail -n 12; done
                    done >"$OUT/ab-host-step.txt"; cat "$OUT/ab-host-step.txt"
                fi'
        fi ;;
    monitortests)
        run_step monitortests 300 bash -c 'python3 -m pytest -m gpu -q -p no:cacheprovider tests/test_prepared_fastpath.py \
            tests/test_monitor*.py tests/test_engine*.py' ;;
    interop)
        run_step interop 240 python3 -m pytest -m gpu -q -p no:cacheprovider tests/test_gpu_interop.py \
            tests/test_validation_memo.py tests/test_launch_scratch.py ;;
    moves)
        if [ -d .base/kvcanary_numba ]; then
            mkdir -p .base/benchmarks && cp benchmarks/__init__.py benchmarks/bench_moves.py benchmarks/timing.py \
                benchmarks/baseline_kernels.py .base/benchmarks/
            run_step moves_base 150 python3 .base/benchmarks/bench_moves.py ${MOVES_ARGS:-} --out "$OUT" --name moves-base
        fi
        run_step moves 150 python3 benchmarks/bench_moves.py ${MOVES_ARGS:-} --out "$OUT" --name moves ;;
    ptx)
        trees=(.)
        [ -d .base/kvcanary_numba ] && trees=(.base .)
        run_step ptx 420 sh -c 'python3 benchmarks/ptx_report.py --json "$OUT/ptx.jsonl" "$@" >"$OUT/ptx.md"; rc=$?;
            cat "$OUT/ptx.md"; exit $rc' ptx "${trees[@]}" ;;
    *)
        echo "unknown step $step (tests, subset, split, cu12, vectors, bench, quick, sanitizer, memcheck, racecheck, fuzz, replays, ab," \
            "abpublic, abcpu, monitortests, interop, moves, ptx)" | tee -a "$SUMMARY" ;;
    esac
done
echo "--- summary ($SUMMARY)"
cat "$SUMMARY"
if [ -n "${PACK:-}" ]; then
    tar czf "$PACK" -C "$OUT" . && echo "packed $OUT into $PACK"
fi
