#!/usr/bin/env bash
# CUDA-graph-timed tables on 2xH200 (issues 5 and 7): tune the shipped shapes with `--timing graph`, export
# them beside the eager table, and bench dispatch with `RuntimeConfig(timing="graph")` (what code that
# runs dispatch inside CUDA graphs should set). Step by step, each under its own limit:
#   source bench/device_env.sh && bash bench/graph_tables_device.sh STEP [STEP ...]
# Steps:
#   eager-extra  the shipped eager table + examples/shapes_extra.csv tuned eager -> $OUT/nvidia-h200_ws2.json
#   graph-ag     ag_gemm rows of the shipped shapes (default table + extra), graph-timed -> $STATE/graph.db
#   graph-fd     examples/shapes_flash_decode.csv, graph-timed -> $STATE/graph.db
#   export-graph $STATE/graph.db -> $OUT/nvidia-h200_ws2_graph.json
#   bench-fd     flash_decode bench, dispatch with the graph table only, timing=graph
#   bench-ag     ag_gemm bench (N=K=8192, $MS), dispatch from $STATE/graph.db, timing=graph
#   retune-ag    after an ag_gemm kernel change: the shipped ag_gemm shapes tuned afresh in both timings
#                (11 trials) -> $STATE/retune_{eager,graph}.db, exported as $OUT/ag_{eager,graph}.json;
#                then, on any machine, `bash bench/merge_table.sh tuning_db/<table>.json ag_<timing>.json`
# STATE (default $OUT) holds the databases; carry it between calls to resume (the tuner resumes).
# GRAPH_TABLE (default $OUT/nvidia-h200_ws2_graph.json) is the table export-graph writes and bench-fd reads.
# A summary line per step is printed last.
set -u
: "${OUT:?source bench/device_env.sh first}"
STATE="${STATE:-$OUT}"
mkdir -p "$STATE"
GRAPH_DB="sqlite:///$STATE/graph.db"
EAGER_DB="sqlite:///$STATE/eager.db"
GRAPH_TABLE="${GRAPH_TABLE:-$OUT/nvidia-h200_ws2_graph.json}"
# shellcheck source=bench/_step.sh
source "$(dirname "$0")/_step.sh"
STEP_TIMEOUT_OPTS=(-s INT -k 20)  # SIGINT: the tuner records its running trial as failed and exits

ag_shapes() {  # the shipped ag_gemm shapes, one header
    { grep -v '^#' examples/shapes_default_table.csv; grep -v '^#' examples/shapes_extra.csv | tail -n +2; } \
        > "$STATE/ag_shapes.csv"
}

for s in "$@"; do
    case "$s" in
    eager-extra)
        rm -f "$STATE"/eager.db*
        step eager_import 60 python3 -P -m autotaxer import tuning_db/nvidia-h200_ws2.json --db "$EAGER_DB"
        step eager_extra "${LIMIT:-120}" python3 -P -m autotaxer tune --world-size 2 --shapes examples/shapes_extra.csv \
            --trials 10 --variants bsp,copy_engine,push,pull --db "$EAGER_DB" --jsonl --trial-timeout 60 --seed 0
        step eager_export 60 python3 -P -m autotaxer export --db "$EAGER_DB" --gpu nvidia-h200 --world-size 2 \
            --out "$OUT/nvidia-h200_ws2.json"
        ;;
    graph-ag)
        ag_shapes
        step graph_ag "${LIMIT:-420}" python3 -P -m autotaxer tune --world-size 2 --shapes "$STATE/ag_shapes.csv" \
            --trials 10 --variants bsp,copy_engine,push,pull --db "$GRAPH_DB" --jsonl --trial-timeout 60 --seed 0 \
            --timing graph
        ;;
    graph-fd)
        step graph_fd "${LIMIT:-240}" python3 -P -m autotaxer tune --world-size 2 --shapes examples/shapes_flash_decode.csv \
            --variants bsp,fused --trials 12 --timeout 20 --trial-timeout 90 --db "$GRAPH_DB" --jsonl --timing graph
        ;;
    export-graph)
        step export_graph 60 python3 -P -m autotaxer export --db "$GRAPH_DB" --gpu nvidia-h200 --world-size 2 \
            --out "$GRAPH_TABLE"
        ;;
    bench-fd)
        step bench_fd "${BENCH_LIMIT:-200}" python3 -P bench/flash_decode_bench.py --quick --dispatch \
            --table "$GRAPH_TABLE" --dispatch-timing graph --timeout "$(( ${BENCH_LIMIT:-200} - 20 ))" \
            --out "$OUT/flash_decode_dispatch_graph.json"
        python3 -P bench/flash_decode_bench.py --summarize "$OUT/flash_decode_dispatch_graph.json" \
            --table "$GRAPH_TABLE" > "$OUT/bench_fd_summary.md" 2>&1
        ;;
    bench-ag)
        step bench_ag "${BENCH_LIMIT:-200}" python3 -P bench/ag_gemm_bench.py --shapes 8192x8192 \
            --m "${MS:-8,16,32,64,128,256}" --no-peers --max-configs 3 --iters 10 --samples 5 --db "$GRAPH_DB" \
            --dispatch-timing graph --out "$OUT/bench_ag_graph.json"
        ;;
    retune-ag)
        ag_shapes
        for timing in eager graph; do
            rm -f "$STATE/retune_$timing.db"
            step "retune_$timing" "${LIMIT:-280}" python3 -P -m autotaxer tune --world-size 2 \
                --shapes "$STATE/ag_shapes.csv" --trials 11 --variants bsp,copy_engine,push,pull \
                --db "sqlite:///$STATE/retune_$timing.db" --jsonl --trial-timeout 60 --seed 0 --timing "$timing"
            step "retune_export_$timing" 60 python3 -P -m autotaxer export --db "sqlite:///$STATE/retune_$timing.db" \
                --gpu nvidia-h200 --world-size 2 --out "$OUT/ag_$timing.json"
        done
        ;;
    *) summary+=("$s: unknown step") ;;
    esac
done
printf '%s\n' "${summary[@]}"
