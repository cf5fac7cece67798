#!/usr/bin/env bash
# flash_decode on the lent 2xH200 (issue 5): tune the 12 issue shapes, ship them in the H200 table, bench
# dispatch against BSP. Run from the repo root after the device set-up, in the same shell:
#
#   source bench/device_env.sh && bash bench/flash_decode_device.sh
#
# Steps (a failed step is reported and the later ones still run where they can):
#   a. import the shipped table (ag_gemm winners) into a fresh SQLite database under $OUT
#   b. tune the shapes (bsp, fused) into it; JSON lines per trial in $OUT/flash_decode_tune.jsonl
#   c. export every op's winners for this GPU and world size to $OUT/nvidia-h200_ws2.json (copy it to
#      tuning_db/ to ship it)
#   d. bench BSP, fused, the local-decode ceiling and dispatch with that table only
#      ($OUT/flash_decode_dispatch_h200x2.json, rewritten after every shape)
#   e. print the summary table
# Budget: about 4-5 minutes after set-up (tuning capped by FD_TUNE_S, the bench by FD_BENCH_S). Every
# setting below can be overridden from the environment (the CPU dry run does: see the end of this file).
set -u -o pipefail

OUT="${OUT:-/tmp/out}"
PY="${FD_PY:-python3 -P}"
SHAPES="${FD_SHAPES:-examples/shapes_flash_decode.csv}"
DEVICE="${FD_DEVICE:-cuda}"
VARIANTS="${FD_VARIANTS:-bsp,fused}"
TRIALS="${FD_TRIALS:-12}"            # launched trials per shape (baseline + seeds first)
SHAPE_S="${FD_SHAPE_S:-20}"          # no new trial of a shape after this many seconds
TRIAL_S="${FD_TRIAL_S:-90}"          # watchdog per trial (first trial of a shape compiles)
TUNE_S="${FD_TUNE_S:-180}"           # the whole tuning step
BENCH_S="${FD_BENCH_S:-150}"         # the whole bench step
TABLE_IN="${FD_TABLE_IN:-tuning_db/nvidia-h200_ws2.json}"
EXPORT_FILTER="${FD_EXPORT_FILTER:---gpu nvidia-h200 --world-size 2}"
TABLE_OUT="${FD_TABLE_OUT:-$OUT/nvidia-h200_ws2.json}"
BENCH_ARGS="${FD_BENCH_ARGS:---quick --dispatch}"

mkdir -p "$OUT"
DB="sqlite:///$OUT/flash_decode_tune.db"
rm -f "$OUT"/flash_decode_tune.db*
BENCH_JSON="$OUT/flash_decode_dispatch_h200x2.json"
declare -a STATUS=()

step() {  # step NAME LOG COMMAND...: run, time, record the exit status, show the log's tail on failure
    local name=$1 log=$2 t0=$SECONDS rc
    shift 2
    echo "== $name: $*"
    "$@" >"$log" 2>&1
    rc=$?
    STATUS+=("$name rc=$rc $((SECONDS - t0))s")
    if [ "$rc" -ne 0 ]; then
        echo "!! $name failed (rc=$rc); last lines of $log:"
        tail -n 15 "$log"
    fi
    return 0
}

# a. the shipped table first, so the export keeps every ag_gemm record
step import "$OUT/flash_decode_import.log" $PY -m autotaxer import "$TABLE_IN" --db "$DB"
cat "$OUT/flash_decode_import.log"

# b. tune; SIGINT at the cap makes the tuner record the running trial as failed and exit cleanly
step tune "$OUT/flash_decode_tune.log" \
    timeout -s INT -k 20 "$TUNE_S" $PY -m autotaxer tune --world-size 2 --device "$DEVICE" \
    --shapes "$SHAPES" --variants "$VARIANTS" --trials "$TRIALS" --timeout "$SHAPE_S" \
    --trial-timeout "$TRIAL_S" --db "$DB" --jsonl
grep -h '^{' "$OUT/flash_decode_tune.log" >"$OUT/flash_decode_tune.jsonl" || true
$PY - "$OUT/flash_decode_tune.jsonl" <<'EOF' || true
import json, sys
for line in open(sys.argv[1]):
    e = json.loads(line)
    if e.get("event") == "shape_done":
        shape = e["key"].split("|")[4]
        print(f"  {shape}: {e['variant']} {e['params']} {e.get('speedup') or 0:.2f}x over bsp "
              f"({e['trials']} trials, {e['failed']} failed, {e['wall_s']:.0f} s) {e.get('note', '')}")
    elif e.get("event") == "summary":
        print(f"  tuned {e['shapes']} shapes, {e['trials_run']} trials in {e['wall_s']:.0f} s")
EOF

# c. export (all ops of this GPU and world size) and show what the table holds
# shellcheck disable=SC2086  # EXPORT_FILTER is a list of options
step export "$OUT/flash_decode_export.log" $PY -m autotaxer export --db "$DB" $EXPORT_FILTER --out "$TABLE_OUT"
cat "$OUT/flash_decode_export.log"
if [ -f "$TABLE_OUT" ]; then
    $PY - "$TABLE_OUT" <<'EOF' || true
import collections, json, sys
recs = json.load(open(sys.argv[1]))["records"]
print("exported records per op:", dict(collections.Counter(r["op"] for r in recs)))
EOF
fi

# d. bench with the exported table only (a missing table: dispatch falls back to BSP everywhere)
table_arg=()
[ -f "$TABLE_OUT" ] && table_arg=(--table "$TABLE_OUT")
# shellcheck disable=SC2086  # BENCH_ARGS is a list of options
step bench "$OUT/flash_decode_bench.log" \
    timeout -k 20 "$((BENCH_S + 15))" $PY bench/flash_decode_bench.py $BENCH_ARGS ${table_arg[@]+"${table_arg[@]}"} \
    --timeout "$BENCH_S" --out "$BENCH_JSON"

# e. summary last
echo
echo "== steps: ${STATUS[*]}"
$PY bench/flash_decode_bench.py --summarize "$BENCH_JSON" ${table_arg[@]+"${table_arg[@]}"} || true

# CPU dry run (no GPU; fused is CUDA-only, the bench needs CUDA and is expected to fail there):
#   printf 'op,B,H,Hkv,D,S,dtype\nflash_decode,2,8,2,64,256,fp32\n' >/tmp/fd_cpu.csv
#   OUT=/tmp/fd_out FD_PY="python -P" FD_DEVICE=cpu FD_VARIANTS=bsp FD_TRIALS=3 FD_SHAPES=/tmp/fd_cpu.csv \
#   FD_EXPORT_FILTER="--world-size 2" bash bench/flash_decode_device.sh
