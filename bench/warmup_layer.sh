#!/usr/bin/env bash
# Warm-up where no table applies, on 2 GPUs (about 5 minutes): the layer benchmark's Llama-3-70B-class
# layer (bench/warmup_layer.py), tables disabled (on H100 none applies anyway):
#   source bench/device_env.sh && bash bench/warmup_layer.sh
# Steps, each under its own limit (logs and JSON under $OUT/warmup_layer, a summary line per step last):
#   shapes    the layer's keys at CASE (default fwd:256) as a shapes file (bench/layer.py --write-shapes)
#   offline   autotaxer tune over them (OFFLINE_S seconds a key, default 30; cold: no nearby seeds), exported
#   warmup    bench/warmup_layer.py: plain, before, autotaxer.warmup(budget BUDGET s, default 120), after,
#             and on the offline table; per key winner, ×fastest BSP, trials, trials to the best (warm-up
#             seeded from the nearest records against the offline search's cold start)
#   overhead  bench/dispatch_overhead.py: the hot path's cost (p50, µs; target <= 2)
set -u
: "${OUT:?source bench/device_env.sh first}"
CASE="${CASE:-fwd:256}" BUDGET="${BUDGET:-120}" OFFLINE_S="${OFFLINE_S:-30}"
W="$OUT/warmup_layer"
mkdir -p "$W"
# shellcheck source=bench/_step.sh
source "$(dirname "$0")/_step.sh"
STEP_TIMEOUT_OPTS=(-s INT -k 20)

step shapes 60 python3 -P bench/layer.py --write-shapes "$W/layer.csv" --world-size 2 --cases "$CASE"
step offline 200 python3 -P -m autotaxer tune --world-size 2 --shapes "$W/layer.csv" --db "sqlite:///$W/offline.sqlite" \
    --trials 24 --timeout "$OFFLINE_S" --trial-timeout 60 --quiet
step export 60 python3 -P -m autotaxer export --db "sqlite:///$W/offline.sqlite" --out "$W/offline.json"
step warmup 300 torchrun --nproc-per-node 2 bench/warmup_layer.py --case "$CASE" --budget "$BUDGET" \
    --db "sqlite:///$W/warm.sqlite" --offline-table "$W/offline.json" --offline-db "sqlite:///$W/offline.sqlite" \
    --out "$W/warmup_layer.json"
step overhead 120 python3 -P bench/dispatch_overhead.py --device cuda --world-size 2 --iters 5000 \
    --json "$W/overhead.json"
printf '%s\n' "${summary[@]}"
