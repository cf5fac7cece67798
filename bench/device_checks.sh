#!/usr/bin/env bash
# GPU checks on 2 GPUs, one step after another, each under a time limit; logs under $OUT.
#   source bench/device_env.sh && bash bench/device_checks.sh [tests ...]
# With no arguments runs every GPU test file. A summary line per step is printed last.
set -u
files=("$@")
[ ${#files[@]} -gt 0 ] || files=(tests/ops/test_copy_engine_gpu.py tests/runtime/test_dispatch_gpu.py tests/ops/test_flash_decode_gpu.py tests/ops/test_ag_gemm_gpu.py)
summary=()
for f in "${files[@]}"; do
    name=$(basename "$f" .py)
    timeout 240 python3 -P -m pytest -q -x -p no:cacheprovider -s "$f" > "$OUT/$name.log" 2>&1
    rc=$?
    summary+=("$name rc=$rc $(tail -n 1 "$OUT/$name.log")")
done
printf '%s\n' "${summary[@]}"
