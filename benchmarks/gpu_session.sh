#!/usr/bin/env bash
# One GPU session on the H200, run from the repository root:
#
#   bash benchmarks/gpu_session.sh                                 # tests vectors bench sanitizer
#   bash benchmarks/gpu_session.sh tests vectors memcheck bench    # one command, about 5 minutes
#
# Steps (each bounded with `timeout`, logged to $OUT/<step>.log; the run goes on when one fails
# and $OUT/summary.txt lists the exit codes; $OUT defaults to ./gpu-out; PACK=file.tgz also
# packs $OUT into one archive at the end, for a device tool that brings back only a few files):
#   tests      the gpu tier and the kernel (simulator-marked) tests on the GPU
#   vectors    golden-vector replay on the GPU ($KVCANARY_VECTORS, else the committed
#              ./tests/data/vectors)
#   bench      the full benchmark: JSON, markdown and PNG plots (about 60 s on the H200;
#              BENCH_BUDGET=s bounds its wall clock, default 330; pinned to core BENCH_PIN, default 3,
#              empty: not pinned; BENCH_ONLY=sections)
#   sanitizer  compute-sanitizer memcheck of benchmarks/sanitizer_check.py (expect 0 errors)
#   memcheck   every kernel test, small and at scale, under memcheck (not in the default list)
#   quick      the benchmark at small sizes, a smoke test of every section (not in the default list)
#   racecheck  the small verify, write and plan kernel tests under racecheck (not in the default list)
#   fuzz       the bad-input harness on CuPy arrays under memcheck (benchmarks/fuzz_cuda.py; copy
#              ../shared/tools/fuzz_bad_inputs.py to ./.fuzz/ first; not in the default list)
#   replays    the launch-layer and monitor GPU tests with KVCANARY_VERIFY_REPLAYS=1 (every replay of
#              packed launches re-runs the glue and must match; not in the default list)
#   candidate  CANDIDATE=<patch>: apply it to a copy of the tree and run its GPU steps there (write /
#              shared-chain / tiled tests, their memcheck and racecheck, bench chain,monitor ->
#              $OUT/candidate/; steps ctests, crace, cbench, or CANDIDATE_STEPS; not in the default list)
#   probe      host us per launch by driver route (benchmarks/results/probes/launch_route_cost.py ->
#              $OUT/launch-route-cost.json; not in the default list)
#   busyprobe  host us of the monitor decode step under the bench's protocol, one ingredient at a time
#              (spin, KV write, events, hot wait, one step ahead; benchmarks/results/probes/busy_monitor_step.py
#              -> $OUT/busy-monitor-step.json; not in the default list)
#   ab         the monitor decode step's host / device time, base tree in .base/ (carried) against this
#              tree, AB_ROUNDS (default 2) rounds in alternating order, pinned to core AB_PIN (default 3)
#              (benchmarks/results/probes/ab_monitor_step.py -> $OUT/ab-monitor-step.jsonl; not in the default list)
#   abpublic   the public CuPy calls' host time, base tree in .base/ against this tree, alternately twice
#              (benchmarks/results/probes/ab_public_calls.py -> $OUT/ab-public-calls.jsonl; not in the default list)
#   pinned     the monitor decode step of this tree with the process pinned to one core and not, alternately
#              (ab_monitor_step.py under taskset -> $OUT/pinned-monitor-step.jsonl; not in the default list)
#   endsplit   end_step's host time split into readback, aftercare and health, pinned, ENDSPLIT_ROUNDS
#              processes (benchmarks/results/probes/end_step_split.py -> $OUT/end-step-split.jsonl;
#              not in the default list)
#   monitortests  the GPU tests of the monitor, its fast path and graph replay, and the toy engine
#              (not in the default list)
#   interop    the GPU tests of every array library, of the validation memo and of launch scratch during
#              a real CUDA-graph capture (not in the default list)
#   tableprobe host us per launch of the decode phases: per-launch loop, compiled launch table,
#              one-buffer parameters (benchmarks/results/probes/launch_table_cost.py ->
#              $OUT/launch-table-cost.json; not in the default list)
python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site:$PWD
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
    printf '%-10s rc=%-4s %4ss\n' "$name" "$rc" "$(($(date +%s) - start))" | tee -a "$SUMMARY"
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

KERNEL_TESTS="tests/test_kernels_plan.py tests/test_kernels_plan_scale.py tests/test_kernels_verify.py
    tests/test_kernels_verify_plans.py tests/test_kernels_write.py tests/test_kernels_write_scenarios.py
    tests/test_kernels_fingerprint.py tests/test_kernels_scatter.py tests/test_kernels_shapes.py
    tests/test_kernels_write_share.py tests/test_kernels_chain.py tests/test_kernels_write_tiled.py
    tests/test_kernels_endpoints.py tests/test_kernels_tiled_endpoints.py tests/test_kernels_translate.py
    tests/test_monitor_budget.py"

nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv >"$OUT/nvidia-smi.txt" 2>&1
for step in "${STEPS[@]}"; do
    case $step in
    tests)
        # gpu tests at scale, and the kernel tests (simulator-marked) on the real GPU; the docs
        # tests need mkdocs/nbformat, which the GPU image lacks.
        run_step tests 420 python3 -m pytest -m "gpu or simulator" -q -p no:cacheprovider \
            --ignore=tests/test_vectors.py --ignore=tests/test_notebooks.py --ignore=tests/test_docs.py \
            --ignore=tests/test_docs_browser.py --ignore=tests/test_ptx.py --junitxml="$OUT/tests.xml" tests ;;
    vectors)
        if dir=$(find_vectors); then
            export KVCANARY_VECTORS=$dir
            run_step vectors 240 python3 -m pytest -q -p no:cacheprovider -m gpu \
                --junitxml="$OUT/vectors.xml" tests/test_vectors.py
        else
            echo "vectors    rc=NA   golden vectors not found (set KVCANARY_VECTORS)" | tee -a "$SUMMARY"
        fi ;;
    bench)
        # Pinned to one core (BENCH_PIN=core, empty: not pinned): the host rows without migrations.
        pin=${BENCH_PIN-3}
        run_step bench 390 python3 benchmarks/run.py --out "$OUT/bench" --budget "${BENCH_BUDGET:-330}" \
            ${pin:+--pin "$pin"} ${BENCH_ONLY:+--only "$BENCH_ONLY"} ;;
    quick)  # a smoke run of every section at small sizes (about a minute, mostly compilation)
        run_step quick 240 python3 benchmarks/run.py --quick --out "$OUT/quick" --budget 200 ;;
    sanitizer)
        if tool=$(find_sanitizer); then
            run_step sanitizer 300 "$tool" --tool memcheck --report-api-errors no --error-exitcode 3 --print-limit 20 \
                python3 benchmarks/sanitizer_check.py
            grep -h "ERROR SUMMARY" "$OUT/sanitizer.log" | tee -a "$SUMMARY"
        else
            echo "sanitizer  rc=NA   compute-sanitizer not found" | tee -a "$SUMMARY"
            run_step sanitizer_plain 120 python3 benchmarks/sanitizer_check.py
        fi ;;
    memcheck)  # every kernel test, small and at scale (large random and garbage batches), under memcheck
        if tool=$(find_sanitizer); then
            # shellcheck disable=SC2086  # MEMCHECK_FILES: a space-separated subset (one call's share)
            run_step memcheck 420 "$tool" --tool memcheck --report-api-errors no --error-exitcode 3 \
                --print-limit 20 python3 -m pytest -m "gpu or simulator" -q -p no:cacheprovider \
                ${MEMCHECK_FILES:-$KERNEL_TESTS}
            grep -h "ERROR SUMMARY" "$OUT/memcheck.log" | tee -a "$SUMMARY"
        else
            echo "memcheck   rc=NA   compute-sanitizer not found" | tee -a "$SUMMARY"
        fi ;;
    racecheck)  # shared-memory hazards (warp staging, scans) in the small kernel tests
        if tool=$(find_sanitizer); then
            run_step racecheck 420 "$tool" --tool racecheck --racecheck-report hazard --error-exitcode 3 \
                --print-limit 20 python3 -m pytest -m simulator -q -p no:cacheprovider tests/test_kernels_verify.py \
                tests/test_kernels_verify_plans.py tests/test_kernels_write.py tests/test_kernels_write_scenarios.py \
                tests/test_kernels_plan.py tests/test_kernels_plan_scale.py tests/test_kernels_shapes.py \
                tests/test_kernels_write_share.py tests/test_kernels_write_tiled.py tests/test_kernels_endpoints.py \
                tests/test_kernels_tiled_endpoints.py
            grep -h "RACECHECK SUMMARY\|ERROR SUMMARY" "$OUT/racecheck.log" | tee -a "$SUMMARY"
        else
            echo "racecheck  rc=NA   compute-sanitizer not found" | tee -a "$SUMMARY"
        fi ;;
    fuzz)
        harness=""
        for f in "$PWD/.fuzz/fuzz_bad_inputs.py" "$PWD/../shared/tools/fuzz_bad_inputs.py"; do
            [ -f "$f" ] && { harness=$f; break; }
        done
        if [ -z "$harness" ]; then
            echo "fuzz       rc=NA   harness not found (copy fuzz_bad_inputs.py to .fuzz/)" | tee -a "$SUMMARY"
        elif tool=$(find_sanitizer); then
            run_step fuzz 540 "$tool" --tool memcheck --report-api-errors no --error-exitcode 3 --print-limit 20 \
                python3 benchmarks/fuzz_cuda.py --harness "$harness" --n 400 --json "$OUT/fuzz-cuda.json"
            grep -h "ERROR SUMMARY" "$OUT/fuzz.log" | tee -a "$SUMMARY"
        else
            run_step fuzz 300 python3 benchmarks/fuzz_cuda.py --harness "$harness" --n 400 --json "$OUT/fuzz-cuda.json"
        fi ;;
    replays)
        KVCANARY_VERIFY_REPLAYS=1 run_step replays 240 python3 -m pytest -m gpu -q -p no:cacheprovider \
            tests/test_prepared.py tests/test_prepared_fastpath.py tests/test_launch_replay.py \
            tests/test_launch_driver.py tests/test_monitor_host_step.py tests/test_gpu_interop.py \
            tests/test_monitor_endpoints.py ;;
    probe)
        run_step probe 120 sh -c "python3 benchmarks/results/probes/launch_route_cost.py > '$OUT/launch-route-cost.json'" ;;
    tableprobe)  # host us per launch of the decode phases: per-launch loop, compiled table, one-buffer parameters
        run_step tableprobe 240 sh -c "python3 benchmarks/results/probes/launch_table_cost.py > '$OUT/launch-table-cost.json'" ;;
    busyprobe)  # which ingredient of the bench's protocol makes the monitor step's host time grow (session 8)
        run_step busyprobe 240 python3 benchmarks/results/probes/busy_monitor_step.py "$OUT/busy-monitor-step.json" ;;
    ab)  # the monitor decode step, base tree (.base/: see the probe's docstring) against this one, alternately
        if [ -d .base/kvcanary_numba ]; then
            # AB_ROUNDS rounds, the order alternated per round, each process pinned (AB_PIN, default 3).
            run_step ab 420 bash -c 'for r in $(seq "${AB_ROUNDS:-2}"); do order=". .base"; [ $((r % 2)) -eq 1 ] &&
                order=".base ."; for t in $order; do taskset -c "${AB_PIN:-3}" python3 \
                benchmarks/results/probes/ab_monitor_step.py "$t" "$t (round $r)" ||
                echo "{\"tree\": \"$t\", \"failed\": true}"; done; done > "$0/ab-monitor-step.jsonl"' "$OUT"
        else
            echo "ab         rc=NA   no base tree in .base/ (git archive REV kvcanary_numba ':(glob)benchmarks/*.py' | tar -x -C .base)" | tee -a "$SUMMARY"
        fi ;;
    abpublic)  # the public CuPy calls, base tree (.base/) against this one, alternately; this tree's verify profiled
        if [ -d .base/kvcanary_numba ]; then
            run_step abpublic 300 sh -c 'for i in 1 2; do for t in .base .; do
                python3 benchmarks/results/probes/ab_public_calls.py "$t" "$t" || echo "{\"tree\": \"$t\", \"failed\": true}";
                done; done > "$0/ab-public-calls.jsonl";
                python3 benchmarks/results/probes/ab_public_calls.py . "./profiled" --profile >> "$0/ab-public-calls.jsonl"' "$OUT"
        else
            echo "abpublic   rc=NA   no base tree in .base/" | tee -a "$SUMMARY"
        fi ;;
    pinned)  # the monitor decode step of this tree, process pinned to one core (taskset) or not, alternately
        run_step pinned 200 sh -c 'for i in 1 2; do
            python3 benchmarks/results/probes/ab_monitor_step.py . unpinned; taskset -c 3 python3 \
            benchmarks/results/probes/ab_monitor_step.py . "pinned to core 3"; done > "$0/pinned-monitor-step.jsonl"' "$OUT" ;;
    endsplit)  # end_step's parts, ENDSPLIT_ROUNDS processes one after another
        run_step endsplit 200 bash -c 'for r in $(seq "${ENDSPLIT_ROUNDS:-2}"); do taskset -c 3 python3 \
            benchmarks/results/probes/end_step_split.py "round $r"; done >"$OUT/end-step-split.jsonl"' ;;
    monitortests)  # the GPU tests of the monitor: hooks, prepared fast path, graph replay, readback, engine
        run_step monitortests 300 bash -c 'python3 -m pytest -m gpu -q -p no:cacheprovider tests/test_prepared_fastpath.py \
            tests/test_monitor*.py tests/test_engine*.py' ;;
    interop)  # every array library through the public calls, the validation memo, launch scratch under capture
        run_step interop 240 python3 -m pytest -m gpu -q -p no:cacheprovider tests/test_gpu_interop.py \
            tests/test_validation_memo.py tests/test_launch_scratch.py ;;
    candidate)  # CANDIDATE=benchmarks/candidates/x.patch: its GPU steps in a patched copy of the tree
        rm -rf /tmp/candidate && cp -r "$PWD" /tmp/candidate && (cd /tmp/candidate && git apply "$CANDIDATE") &&
        (cd /tmp/candidate && PACK= OUT="$OUT/candidate" MEMCHECK_FILES="tests/test_kernels_write_tiled.py
            tests/test_kernels_write_share.py" LIMIT_tests=${LIMIT_ctests:-120} LIMIT_memcheck=${LIMIT_cmemcheck:-90} \
            bash benchmarks/gpu_session.sh ${CANDIDATE_STEPS:-ctests memcheck crace cbench}) ;;
    ctests)
        run_step tests 180 python3 -m pytest -m "gpu or simulator" -q -p no:cacheprovider tests/test_kernels_write.py \
            tests/test_kernels_write_scenarios.py tests/test_kernels_write_share.py tests/test_kernels_write_tiled.py \
            tests/test_kernels_tiled_endpoints.py tests/test_kernels_chain.py ;;
    crace)
        if tool=$(find_sanitizer); then
            run_step racecheck 120 "$tool" --tool racecheck --racecheck-report hazard --error-exitcode 3 \
                --print-limit 20 python3 -m pytest -m simulator -q -p no:cacheprovider \
                tests/test_kernels_write_share.py tests/test_kernels_write_tiled.py
            grep -h "RACECHECK SUMMARY\|ERROR SUMMARY" "$OUT/racecheck.log" | tee -a "$SUMMARY"
        fi ;;
    cbench)
        run_step bench 120 python3 benchmarks/run.py --only chain,monitor --out "$OUT/bench" --budget 100 ;;
    *)
        echo "unknown step $step (tests, vectors, bench, sanitizer, memcheck, quick, racecheck, fuzz, replays, probe, tableprobe, busyprobe, ab, abpublic, pinned, endsplit, monitortests, interop, candidate)" | tee -a "$SUMMARY" ;;
    esac
done
echo "--- summary ($SUMMARY)"
cat "$SUMMARY"
if [ -n "${PACK:-}" ]; then
    tar czf "$PACK" -C "$OUT" . && echo "packed $OUT into $PACK"
fi
