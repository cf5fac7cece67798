#!/usr/bin/env bash
# Issue 36 on GPUs (2 GPUs; WS=1 on one), each step under a time limit, logs under $OUT, a summary line per
# step printed last (~4 min on 2 H100s):
#   source bench/device_env.sh && bash bench/first_measurement_device.sh
# Steps:
#   first     bench/first_measurement.py: BSP at M=64 first, after larger M, and again, in fresh ranks,
#             eager and graph, without and with the process warm-up -> $OUT/first_measurement.json
#   tune      autotaxer tune over the smoke shapes, eager then graph timing, 6 trials (the warm-up runs
#             before each group's first trial) -> $OUT/issue36.db, $OUT/issue36_graph.db
#   bench     autotaxer bench over the smoke shapes at 80 columns (the compact table), progress lines,
#             dispatch from the same database as the tuned configurations -> $OUT/issue36_bench.json
#   tests     the CPU test of the first measurement and the GPU tests of measure/dispatch at world size $WS
set -u
: "${OUT:?source bench/device_env.sh first}"
WS="${WS:-2}"
# shellcheck source=bench/_step.sh
source "$(dirname "$0")/_step.sh"
SMOKE=examples/shapes_smoke_gpu.csv

step first 240 python3 -P bench/first_measurement.py --device cuda --world-size "$WS" --out "$OUT/first_measurement.json"
step tune 150 python3 -P -m autotaxer tune --world-size "$WS" --shapes "$SMOKE" --trials 6 --sampled 0 \
    --db "sqlite:///$OUT/issue36.db" --quiet
step tune-graph 150 python3 -P -m autotaxer tune --world-size "$WS" --shapes "$SMOKE" --trials 6 --sampled 0 \
    --timing graph --db "sqlite:///$OUT/issue36_graph.db" --quiet
step bench 200 env COLUMNS=80 python3 -P -m autotaxer bench --world-size "$WS" --shapes "$SMOKE" --no-peers \
    --db "sqlite:///$OUT/issue36.db" --out "$OUT/issue36_bench.json"
step tests 200 python3 -P -m pytest -q -p no:cacheprovider tests/tuner/test_first_measurement.py \
    tests/tuner/test_measure.py tests/runtime/test_dispatch_gpu.py
printf '%s\n' "${summary[@]}"
