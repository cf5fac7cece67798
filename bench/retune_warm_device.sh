#!/usr/bin/env bash
# After a kernel change, on $WS GPUs (default 2): re-measure the shipped tables' configurations of the affected shapes
# with the new kernel, starting from the previous winners (`autotaxer tune --warm-start`), keep a record
# only where it beats the shipped one (`autotaxer merge`), then bench N=K=8192 against the result.
#   source bench/device_env.sh && SHAPES=stale.csv WARM="old_ws2.json old_ws2_graph.json" \
#       bash bench/retune_warm_device.sh tune bench
# (stale.csv from `autotaxer show --stale-out` on a database the shipped tables were imported into)
# Steps: tune (both timings, $TRIALS trials, default 6, $VARIANTS, default bsp,copy_engine,push,pull) -> $OUT/warm_{eager,graph}.json and the merged
# tables $OUT/nvidia-h200_ws$WS{,_graph}.json; bench (ag_gemm_bench.py, $BENCH_SHAPES (default 8192x8192), every M or $BENCH_M,
# both layouts, dispatch from $OUT's merged graph table, else the shipped one; BENCH_LIMIT s) ->
# $OUT/bench_$BENCH_NAME.json. Summary last.
set -u
: "${OUT:?source bench/device_env.sh first}"
STATE="${STATE:-/tmp/warm}"
WS="${WS:-2}"
TABLE="tuning_db/nvidia-h200_ws$WS"
mkdir -p "$STATE"
# shellcheck source=bench/_step.sh
source "$(dirname "$0")/_step.sh"
STEP_TIMEOUT_OPTS=(-s INT -k 20)
warm=()
for w in ${WARM:-} "$TABLE.json" "${TABLE}_graph.json"; do warm+=(--warm-start "$w"); done
at() { python3 -P -m autotaxer "$@"; }
for s in "$@"; do
    case "$s" in
    tune)
        for timing in eager graph; do
            table=$TABLE.json
            [ "$timing" = graph ] && table=${TABLE}_graph.json
            rm -f "$STATE/warm_$timing.db"
            step "warm_$timing" "${LIMIT:-150}" python3 -P -m autotaxer tune --world-size "$WS" --shapes "${SHAPES:?shapes csv}" \
                --trials "${TRIALS:-6}" --variants "${VARIANTS:-bsp,copy_engine,push,pull}" --db "sqlite:///$STATE/warm_$timing.db" \
                --jsonl --trial-timeout 60 --seed 0 --timing "$timing" "${warm[@]}"
            at export --db "sqlite:///$STATE/warm_$timing.db" --gpu nvidia-h200 --world-size "$WS" --out "$OUT/warm_$timing.json"
            step "pick_$timing" 60 python3 -P -m autotaxer merge "$table" "$OUT/warm_$timing.json" --out "$OUT/$(basename "$table")"
        done
        ;;
    bench)
        rm -f "$STATE/graph.db"
        graph_table=$OUT/nvidia-h200_ws${WS}_graph.json
        [ -f "$graph_table" ] || graph_table=${TABLE}_graph.json
        at import "$graph_table" --db "sqlite:///$STATE/graph.db" -q
        name=${BENCH_NAME:-8192x8192}
        step "bench_$name" "${BENCH_LIMIT:-330}" python3 -P bench/ag_gemm_bench.py --world-size "$WS" --shapes "${BENCH_SHAPES:-8192x8192}" --max-configs 3 \
            --iters 10 --samples 7 --peer-timeout 1 --layouts "${LAYOUTS:-0,1}" ${BENCH_M:+--m "$BENCH_M"} --db "sqlite:///$STATE/graph.db" --dispatch-timing graph \
            --out "$OUT/bench_$name.json"
        ;;
    *) summary+=("$s: unknown step") ;;
    esac
done
printf '%s\n' "${summary[@]}"
