#!/usr/bin/env bash
# Temporary (not committed): one device call for the prefill work.
python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site:$PWD
export NUMBA_ENABLE_CUDASIM=0 PYTHONUNBUFFERED=1
OUT=${OUT:-$PWD/gpu-out}; mkdir -p $OUT
step() { local name=$1 limit=$2; shift 2; local t=$(date +%s); timeout --kill-after=10 $limit "$@" > $OUT/$name.log 2>&1; echo "$name rc=$? $(( $(date +%s) - t ))s"; tail -n 4 $OUT/$name.log; }
tool=$(command -v compute-sanitizer || find /usr/local /opt -maxdepth 6 -name compute-sanitizer -type f 2>/dev/null | head -1)
for s in ${STEPS:-tests memcheck racecheck bench}; do case $s in
tests) step tests 200 python3 -m pytest -m "gpu or simulator" -q -p no:cacheprovider -x tests/test_kernels_write_tiled.py tests/test_kernels_write_share.py tests/test_kernels_write.py tests/test_kernels_write_scenarios.py tests/test_kernels_chain.py ;;
memcheck) step memcheck 150 $tool --tool memcheck --report-api-errors no --error-exitcode 3 --print-limit 20 python3 -m pytest -m simulator -q -p no:cacheprovider tests/test_kernels_write_tiled.py tests/test_kernels_write_share.py; grep -h "ERROR SUMMARY" $OUT/memcheck.log | tail -2 ;;
racecheck) step racecheck 150 $tool --tool racecheck --racecheck-report hazard --error-exitcode 3 --print-limit 20 python3 -m pytest -m simulator -q -p no:cacheprovider tests/test_kernels_write_tiled.py tests/test_kernels_write_share.py; grep -h "RACECHECK SUMMARY\|ERROR SUMMARY" $OUT/racecheck.log | tail -2 ;;
bench) step bench 240 python3 benchmarks/run.py --only chain,monitor --out $OUT --name prefill; grep -A80 "write chain\|monitor step device" $OUT/prefill.md | head -0 ;;
esac; done
