#!/usr/bin/env bash
# autotaxer.async_tp on the lent GPUs, as named steps (each under its own time limit, logs under $OUT, a
# summary line per step printed last):
#   source bench/device_env.sh && WS=2 bash bench/async_tp_device.sh STEP [STEP ...]
# Steps:
#   tests     tests/test_async_tp_gpu.py (world size 1, and 2 where 2 GPUs are visible)
#   untuned   bench/async_tp_check.py under torchrun: the compiled block with async TP, torch's kernels
#             against autotaxer's (no record for its keys: every call is torch's, so this measures the
#             override's own cost), the untuned keys written to $OUT/atp_misses/{ag_gemm,gemm_rs}.csv
#   tune      autotaxer tune over those keys ($TRIALS trials, default 16) -> $OUT/atp.db
#   tuned     the tuned records exported to $OUT/atp_table.json, then bench/async_tp_check.py serving them
#             -> $OUT/atp_ws$WS.json (layer and per-call times, counters, keys)
# Block size: SEQ (4096), BATCH (1), HIDDEN (8192), FFN (28672), MODES (fwd,train).
set -u
: "${OUT:?source bench/device_env.sh first}"
: "${WS:?set WS to the number of GPUs}"
SEQ="${SEQ:-4096}" BATCH="${BATCH:-1}" HIDDEN="${HIDDEN:-8192}" FFN="${FFN:-28672}" MODES="${MODES:-fwd,train}"
DB="sqlite:///$OUT/atp.db"
# shellcheck source=bench/_step.sh
source "$(dirname "$0")/_step.sh"
STEP_TIMEOUT_OPTS=(-s INT -k 20)

check() {  # check NAME EXTRA_ARGS...
    local name=$1
    shift
    step "$name" 540 torchrun --nproc-per-node "$WS" bench/async_tp_check.py --seq "$SEQ" --batch "$BATCH" \
        --hidden "$HIDDEN" --ffn "$FFN" --modes "$MODES" "$@"
}

for s in "$@"; do
    case "$s" in
    tests) step "tests_async_tp" 540 python3 -P -m pytest -q -p no:cacheprovider -rs tests/test_async_tp_gpu.py ;;
    untuned) check "atp_untuned_ws$WS" --misses-out "$OUT/atp_misses" --json-out "$OUT/atp_untuned_ws$WS.json" ;;
    tune)
        for op in ag_gemm gemm_rs; do
            [ -f "$OUT/atp_misses/$op.csv" ] || { summary+=("tune_$op: no $OUT/atp_misses/$op.csv (run untuned)"); continue; }
            step "atp_tune_$op" 540 python3 -P -m autotaxer tune --world-size "$WS" --shapes "$OUT/atp_misses/$op.csv" \
                --trials "${TRIALS:-16}" --db "$DB" --jsonl --trial-timeout 60 --seed 0
        done
        ;;
    tuned)
        step "atp_export" 60 python3 -P -m autotaxer export --db "$DB" --world-size "$WS" --out "$OUT/atp_table.json"
        check "atp_tuned_ws$WS" --table "$OUT/atp_table.json" --json-out "$OUT/atp_ws$WS.json"
        ;;
    *) summary+=("$s: unknown step") ;;
    esac
done
printf '%s\n' "${summary[@]}"
