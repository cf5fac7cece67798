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
#                then, on any machine, `autotaxer merge tuning_db/<table>.json ag_<timing>.json --all`;
#                TIMINGS="eager" or "graph" runs one of them (one call of a device's time limit each)
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

tune_ag() {  # tune_ag NAME LIMIT_S SHAPES TRIALS DB [OPTION...]: the ag_gemm variants of the shipped tables
    local name=$1 limit=$2 shapes=$3 trials=$4 db=$5
    shift 5
    step "$name" "$limit" python3 -P -m autotaxer tune --world-size 2 --shapes "$shapes" --trials "$trials" \
        --variants bsp,copy_engine,push,pull --db "$db" --jsonl --trial-timeout 60 --seed 0 "$@"
}

export_table() {  # export_table NAME DB OUT: the 2xH200 records of DB as a table file
    step "$1" 60 python3 -P -m autotaxer export --db "$2" --gpu nvidia-h200 --world-size 2 --out "$3"
}

for s in "$@"; do
    case "$s" in
    eager-extra)
        rm -f "$STATE"/eager.db*
        step eager_import 60 python3 -P -m autotaxer import tuning_db/nvidia-h200_ws2.json --db "$EAGER_DB"
        tune_ag eager_extra "${LIMIT:-120}" examples/shapes_extra.csv 10 "$EAGER_DB"
        export_table eager_export "$EAGER_DB" "$OUT/nvidia-h200_ws2.json"
        ;;
    graph-ag)
        ag_shapes
        tune_ag graph_ag "${LIMIT:-420}" "$STATE/ag_shapes.csv" 10 "$GRAPH_DB" --timing graph
        ;;
    graph-fd)
        step graph_fd "${LIMIT:-240}" python3 -P -m autotaxer tune --world-size 2 --shapes examples/shapes_flash_decode.csv \
            --variants bsp,fused --trials 12 --timeout 20 --trial-timeout 90 --db "$GRAPH_DB" --jsonl --timing graph
        ;;
    export-graph)
        export_table export_graph "$GRAPH_DB" "$GRAPH_TABLE"
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
        for timing in ${TIMINGS:-eager graph}; do
            rm -f "$STATE/retune_$timing.db"
            tune_ag "retune_$timing" "${LIMIT:-280}" "$STATE/ag_shapes.csv" 11 "sqlite:///$STATE/retune_$timing.db" \
                --timing "$timing"
            export_table "retune_export_$timing" "sqlite:///$STATE/retune_$timing.db" "$OUT/ag_$timing.json"
        done
        ;;
    *) summary+=("$s: unknown step") ;;
    esac
done
printf '%s\n' "${summary[@]}"
