#!/usr/bin/env bash
# Issue 6 on a lent 4- or 8-GPU machine (nvidia-h200-x4 / nvidia-h200-x8), step by step, each step under its
# own time limit, logs under $OUT:
#   source bench/device_env.sh && WS=4 bash bench/large_world_device.sh STEP [STEP ...]
# Steps:
#   tune         autotaxer tune --world-size $WS over $SHAPES (default examples/shapes_llm.csv), every ag_gemm
#                variant, $TRIALS (default 10) trials, eager timing -> $STATE/ws$WS.db; resumable: carry
#                $STATE and run the step again (SIGINT at the limit records the running trial as failed)
#   tune-graph   the same with --timing graph -> $STATE/ws${WS}_graph.db (one timing mode per database:
#                the tuner refuses to tune a key of the eager database with --timing graph)
#   export       both databases' records at world size $WS -> $OUT/nvidia-h200_ws$WS.json and
#                $OUT/nvidia-h200_ws${WS}_graph.json, the files tuning_db/ ships
#   bench        autotaxer bench --world-size $WS over $SHAPES, graph-tuned configs and dispatch from the graph
#                database -> $OUT/bench_ws$WS.json (BSP, all-gather and GEMM alone, variants, dispatch, torch,
#                Iris stock; eager and graph timings of each)
# LIMIT overrides the time limit (s) of the tune steps (default 500), BENCH_LIMIT that of bench (default 540).
# A summary line per step is printed last.
set -u
: "${OUT:?source bench/device_env.sh first}"
: "${WS:?set WS to the number of GPUs (4 or 8)}"
STATE="${STATE:-$OUT}"
SHAPES="${SHAPES:-examples/shapes_llm.csv}"
DB="sqlite:///$STATE/ws$WS.db"
DB_GRAPH="sqlite:///$STATE/ws${WS}_graph.db"
mkdir -p "$STATE"
# shellcheck source=bench/_step.sh
source "$(dirname "$0")/_step.sh"
STEP_TIMEOUT_OPTS=(-s INT -k 20)  # SIGINT: the tuner records its running trial as failed and exits

tune_ws() {  # tune_ws NAME TIMING DB
    step "$1" "${LIMIT:-500}" python3 -P -m autotaxer tune --world-size "$WS" --shapes "$SHAPES" \
        --trials "${TRIALS:-10}" --variants bsp,copy_engine,push,pull --db "$3" --jsonl --trial-timeout 60 \
        --seed 0 --timing "$2"
}

export_ws() {  # export_ws NAME DB FILE
    step "$1" 60 python3 -P -m autotaxer export --db "$2" --gpu nvidia-h200 --world-size "$WS" --out "$OUT/$3"
}

for s in "$@"; do
    case "$s" in
    tune) tune_ws "tune_ws$WS" eager "$DB" ;;
    tune-graph) tune_ws "tune_graph_ws$WS" graph "$DB_GRAPH" ;;
    export)
        export_ws "export_ws$WS" "$DB" "nvidia-h200_ws$WS.json"
        export_ws "export_graph_ws$WS" "$DB_GRAPH" "nvidia-h200_ws${WS}_graph.json"
        ;;
    bench)
        step "bench_ws$WS" "${BENCH_LIMIT:-540}" python3 -P -m autotaxer bench --world-size "$WS" --shapes "$SHAPES" \
            --device cuda --db "$DB_GRAPH" --dispatch-timing graph --max-configs 3 --iters 10 --samples 5 \
            --peer-timeout 20 --out "$OUT/bench_ws$WS.json"
        ;;
    *) summary+=("$s: unknown step") ;;
    esac
done
printf '%s\n' "${summary[@]}"
