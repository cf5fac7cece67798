#!/usr/bin/env bash
# The multi-GPU run issues (2 and 8 GPUs; 4 with CUDA_VISIBLE_DEVICES) as named steps, each under its own
# time limit (every device call ends within 10 minutes: split the steps and the shapes across calls), logs
# under $OUT, a summary line per step printed last:
#   source bench/device_env.sh && WS=8 bash bench/run_device.sh STEP [STEP ...]
# Steps:
#   tests        the GPU tests at world size $WS (every variant's reference check and fresh outputs, the
#                gradients of dispatch / ColumnParallelLinear / RowParallelLinear against PyTorch, gemm_rs,
#                bsp_symm, dispatch under CUDA graphs and torch.compile)
#   example      examples/tp_block.py under torchrun: loss against the unsharded model, then the time per
#                step of autotaxer against --plain (S=$SEQ, H=$HIDDEN, bf16)
#   tune         autotaxer tune --world-size $WS over $SHAPES (default: the ag_gemm LLM shapes in both
#                weight layouts and the gemm_rs shapes), every non-experimental variant and the BSP forms,
#                $TRIALS trials (default 24) and at least $SAMPLED (default 16) sampler draws after the
#                seeds, eager timing -> $STATE/ws$WS.db; resumable: carry $STATE and run the step again
#   tune-graph   the same with --timing graph -> $STATE/ws${WS}_graph.db
#   export       both databases' records -> $OUT/new_ws$WS.json and $OUT/new_ws${WS}_graph.json, merged
#                into the shipped tables (autotaxer merge --all: the re-tune replaces what it covers)
#                -> $OUT/nvidia-h200_ws$WS.json and $OUT/nvidia-h200_ws${WS}_graph.json
#   bench        autotaxer bench --world-size $WS over $SHAPES: every BSP form, the communication and the
#                GEMM alone, every variant at its graph-tuned configuration, dispatch with the merged graph
#                table, torch's fused ops -> $OUT/bench_ws$WS.json (eager and graph timings of each)
# SHAPES may name several files (space-separated); they are concatenated into one. LIMIT overrides the tune
# steps' time limit (default 540 s), BENCH_LIMIT that of bench (default 540); GPU the model exported
# (default nvidia-h200). Dry run on one GPU (2026-11-25, H100): WS=1 with a 2-row shapes file, every step
# but tests in 190 s.
set -u
: "${OUT:?source bench/device_env.sh first}"
: "${WS:?set WS to the number of GPUs}"
STATE="${STATE:-$OUT}"
SHAPES="${SHAPES:-examples/shapes_llm.csv examples/shapes_llm_linear.csv examples/shapes_gemm_rs.csv}"
DB="sqlite:///$STATE/ws$WS.db"
DB_GRAPH="sqlite:///$STATE/ws${WS}_graph.db"
SEQ="${SEQ:-4096}" HIDDEN="${HIDDEN:-8192}"
mkdir -p "$STATE"
# shellcheck source=bench/_step.sh
source "$(dirname "$0")/_step.sh"
STEP_TIMEOUT_OPTS=(-s INT -k 20)  # SIGINT: the tuner records its running trial as interrupted and exits

# one shapes file with every row of $SHAPES (comments and each file's header dropped but the first's)
shapes_file="$STATE/shapes_ws$WS.csv"
echo "op,M,N,K,dtype,gather_dim,scatter_dim,b_layout" > "$shapes_file"
for f in $SHAPES; do
    python3 -P - "$f" >> "$shapes_file" <<'PY'
import csv, sys
rows = [line for line in open(sys.argv[1]) if line.strip() and not line.lstrip().startswith("#")]
for r in csv.DictReader(rows):
    print(",".join(r.get(k) or "" for k in ("op", "M", "N", "K", "dtype", "gather_dim", "scatter_dim", "b_layout")))
PY
done

tune_ws() {  # tune_ws NAME TIMING DB
    step "$1" "${LIMIT:-540}" python3 -P -m autotaxer tune --world-size "$WS" --shapes "$shapes_file" \
        --trials "${TRIALS:-24}" --sampled "${SAMPLED:-16}" --db "$3" --jsonl --trial-timeout 60 --seed 0 \
        --timing "$2"
}

export_ws() {  # export_ws NAME DB SUFFIX
    step "$1" 60 python3 -P -m autotaxer export --db "$2" --gpu "${GPU:-nvidia-h200}" --world-size "$WS" \
        --out "$OUT/new_ws$WS$3.json"
    local shipped="tuning_db/nvidia-h200_ws$WS$3.json"
    if [ -f "$shipped" ]; then
        step "merge_$1" 60 python3 -P -m autotaxer merge "$shipped" "$OUT/new_ws$WS$3.json" --all \
            --out "$OUT/nvidia-h200_ws$WS$3.json"
    else
        cp "$OUT/new_ws$WS$3.json" "$OUT/nvidia-h200_ws$WS$3.json"
    fi
}

for s in "$@"; do
    case "$s" in
    tests)
        for f in tests/ops/test_ag_gemm_gpu.py tests/runtime/test_integration_gpu.py tests/ops/test_gemm_rs_gpu.py \
                 tests/ops/test_bsp_symm_gpu.py tests/runtime/test_dispatch_gpu.py tests/ops/test_copy_engine_gpu.py; do
            step "tests_$(basename "$f" .py)" 280 python3 -P -m pytest -q -x -p no:cacheprovider -rs "$f"
        done
        ;;
    example)
        step "example_loss_ws$WS" 240 torchrun --nproc-per-node "$WS" examples/tp_block.py --device cuda
        for how in "" --plain; do
            step "example_time_ws$WS${how}" 240 torchrun --nproc-per-node "$WS" examples/tp_block.py --device cuda \
                --dtype bf16 --seq "$SEQ" --hidden "$HIDDEN" --batch 1 --steps 20 $how
        done
        ;;
    tune) tune_ws "tune_ws$WS" eager "$DB" ;;
    tune-graph) tune_ws "tune_graph_ws$WS" graph "$DB_GRAPH" ;;
    export)
        export_ws "export_ws$WS" "$DB" ""
        export_ws "export_graph_ws$WS" "$DB_GRAPH" "_graph"
        ;;
    bench)
        table="$OUT/nvidia-h200_ws${WS}_graph.json"
        [ -f "$table" ] || table="tuning_db/nvidia-h200_ws${WS}_graph.json"
        step "bench_ws$WS" "${BENCH_LIMIT:-540}" env AUTOTAXER_TABLE="$table" python3 -P -m autotaxer bench \
            --world-size "$WS" --shapes "$shapes_file" --device cuda --db "$DB_GRAPH" --dispatch-timing graph \
            --max-configs 3 --iters 10 --samples 7 --peer-timeout 30 --out "$OUT/bench_ws$WS.json"
        ;;
    *) summary+=("$s: unknown step") ;;
    esac
done
printf '%s\n' "${summary[@]}"
