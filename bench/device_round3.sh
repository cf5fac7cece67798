#!/usr/bin/env bash
# Round 3 on 2xH200, step by step, each step under its own time limit; logs and results under $OUT.
#   source bench/device_env.sh && bash bench/device_round3.sh STEP [STEP ...]
# Steps:
#   tests      push/pull GPU tests (bf16, seed configurations, launch cache)
#   tests-ce   every non-Iris variant on GPU (bsp, copy_engine), bf16
#   tests-dispatch  dispatch GPU tests
#   tune       autotaxer tune over examples/shapes_llm.csv with every ag_gemm variant -> $OUT/tune_llm.sqlite
#   bench-NxK  the side-by-side benchmark for one (N, K), 12 M values, both layouts (uses the tune db
#              when $DB or $OUT/tune_llm.sqlite exists)
#   overhead   dispatch host overhead
# LIMIT overrides the time limit (s) of tests and tune, BENCH_LIMIT that of each bench step; VARIANTS
# (comma list), MS (comma list of M) and NO_PEERS=1 narrow a bench step.
#   export     the tune db's table -> $OUT/nvidia-h200_ws2_ag_gemm.json
# A summary line per step is printed last.
set -u
: "${OUT:?source bench/device_env.sh first}"
DB="${DB:-$OUT/tune_llm.sqlite}"
# shellcheck source=bench/_step.sh
source "$(dirname "$0")/_step.sh"

for s in "$@"; do
    case "$s" in
    tests)
        step tests_fused "${LIMIT:-330}" python3 -P -m pytest -q -x -p no:cacheprovider tests/ops/test_ag_gemm_gpu.py \
            -k "launch_cache or (iris_fused and bf16)"
        ;;
    tests-ce)
        step tests_ce "${LIMIT:-300}" python3 -P -m pytest -q -x -p no:cacheprovider tests/ops/test_ag_gemm_gpu.py \
            -k "every_variant and bf16"
        ;;
    tests-dispatch)
        step tests_dispatch "${LIMIT:-150}" python3 -P -m pytest -q -s -x -p no:cacheprovider tests/runtime/test_dispatch_gpu.py
        ;;
    tune)
        step tune "${LIMIT:-420}" python3 -P -m autotaxer tune --world-size 2 --shapes examples/shapes_llm.csv --trials 10 \
            --variants bsp,copy_engine,push,pull --db "sqlite:///$DB" --jsonl --trial-timeout 60 --seed 0
        cp "$OUT/tune.log" "$OUT/tune_llm.jsonl"
        ;;
    bench-*)
        shape=${s#bench-}
        dbarg=()
        [ -f "$DB" ] && dbarg=(--db "sqlite:///$DB")
        [ -n "${VARIANTS:-}" ] && dbarg+=(--variants "$VARIANTS")
        [ -n "${MS:-}" ] && dbarg+=(--m "$MS")
        [ -n "${NO_PEERS:-}" ] && dbarg+=(--no-peers)
        step "bench_$shape" "${BENCH_LIMIT:-540}" python3 -P bench/ag_gemm_bench.py --shapes "$shape" --max-configs 3 \
            --iters 10 --samples 5 --peer-timeout 25 "${dbarg[@]}" --out "$OUT/bench_$shape.json"
        ;;
    overhead)
        step overhead 120 python3 -P bench/dispatch_overhead.py --device cuda --world-size 2 --iters 20000 \
            --json "$OUT/dispatch_overhead.json"
        ;;
    export)
        step export 60 python3 -P -m autotaxer export --db "sqlite:///$DB" --out "$OUT/nvidia-h200_ws2_ag_gemm.json"
        ;;
    *) summary+=("$s: unknown step") ;;
    esac
done
printf '%s\n' "${summary[@]}"
