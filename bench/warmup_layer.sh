#!/usr/bin/env bash
# Warm-up where no table applies, on 2 GPUs (about 5 minutes): the layer benchmark's Llama-3-70B-class
# layer (bench/warmup_layer.py) on a runtime with no shipped table (on H100 none applies anyway):
#   source bench/device_env.sh && bash bench/warmup_layer.sh
# On 2xH200, against the layer's table tuned offline there (bench/results/2026-11-26_layer_ws2_h200/),
# with no offline tuning in this run and the warm-up's whole 3 minutes:
#   OFFLINE_TABLE=bench/results/2026-11-26_layer_ws2_h200/nvidia-h200_ws2_layer.json \
#   OFFLINE_LOG=bench/results/2026-11-26_layer_ws2_h200/tune_layer_keys.jsonl.gz BUDGET=170 bash bench/warmup_layer.sh
# Steps, each under its own limit (logs and JSON under $OUT/warmup_layer, a summary line per step last):
#   shapes, offline, export   (unless OFFLINE_TABLE is given) the layer's keys at CASE (default fwd:256),
#             tuned by autotaxer tune (OFFLINE_S seconds a key, default 30; no nearby seeds: the cold
#             search) and exported
#   warmup    bench/warmup_layer.py: before, autotaxer.warmup (BUDGET s in all, default 120), after, and on
#             the offline table (plain PyTorch and autotaxer, eager); per key the winner, ×fastest BSP,
#             trials, and the trials each search took to come within 2% of the best either found
#   overhead  bench/dispatch_overhead.py: the hot path's cost (p50 µs; target <= 2)
set -u
: "${OUT:?source bench/device_env.sh first}"
CASE="${CASE:-fwd:256}" BUDGET="${BUDGET:-120}" OFFLINE_S="${OFFLINE_S:-30}"
W="$OUT/warmup_layer"
mkdir -p "$W"
# shellcheck source=bench/_step.sh
source "$(dirname "$0")/_step.sh"
STEP_TIMEOUT_OPTS=(-s INT -k 20)

TABLE="${OFFLINE_TABLE:-}" LOG="${OFFLINE_LOG:-}"
if [ -z "$TABLE" ]; then
    TABLE="$W/offline.json" LOG="sqlite:///$W/offline.sqlite"
    step shapes 60 python3 -P bench/layer.py --write-shapes "$W/layer.csv" --world-size 2 --cases "$CASE"
    step offline 200 python3 -P -m autotaxer tune --world-size 2 --shapes "$W/layer.csv" --db "$LOG" \
        --trials 24 --timeout "$OFFLINE_S" --trial-timeout 120 --quiet
    step export 60 python3 -P -m autotaxer export --db "$LOG" --out "$TABLE"
fi
step warmup 330 torchrun --nproc-per-node 2 bench/warmup_layer.py --case "$CASE" --budget "$BUDGET" \
    --db "sqlite:///$W/warm.sqlite" --offline-table "$TABLE" ${LOG:+--offline-db "$LOG"} \
    --out "$W/warmup_layer.json"
step overhead 120 python3 -P bench/dispatch_overhead.py --device cuda --world-size 2 --iters 5000 \
    --json "$W/overhead.json"
printf '%s\n' "${summary[@]}"
