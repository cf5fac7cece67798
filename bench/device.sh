#!/usr/bin/env bash
# The device runner: set-up on a lent GPU machine and the measurements as named steps, from the repository
# root. Source it for the set-up alone (then run your own commands as `python3 -P ...`):
#   source bench/device.sh
# or run steps, each under its own time limit (every device call ends within 10 minutes: split the steps
# and the shapes across calls), logs under $OUT, a summary line per step printed last:
#   WS=2 bash bench/device.sh STEP [STEP ...]
# Set-up (once a shell; `AUTOTAXER_DEVICE_ENV` marks it done): NVLink multicast off, the carried wheels
# (.whl: optuna, sqlalchemy, alembic, iris, ...) and this package installed (non-editable, into a fresh
# folder: kernels/ must be importable as autotaxer.kernels, which a $PWD entry on PYTHONPATH would
# shadow), $OUT (default /tmp/out) created.
# Steps:
#   checks       the GPU tests of copy engine, dispatch, flash decode and ag_gemm (each file under 240 s)
#   tests        the run issues' GPU tests at world size $WS (every variant's reference check and fresh
#                outputs, the gradients of dispatch / ColumnParallelLinear / RowParallelLinear against
#                PyTorch, gemm_rs, bsp_symm, dispatch under CUDA graphs and torch.compile)
#   gpu          every GPU test but the emulated ones, at the visible GPUs' world size
#   emulated     the N-rank emulation tests on one GPU (the fused kernels at 4 and 8 ranks, the copy-engine
#                family of both ops at 2, 4 and 8; K selects tests with -k)
#   ag-tests     tests/ops/test_ag_gemm_gpu.py alone (longer than one file's limit in `checks`/`tests`: it
#                compiles every variant's kernels), K and TEST_LIMIT as for those; on 4 GPUs split it, e.g.
#                CUDA_VISIBLE_DEVICES=0,1 K="not iris and not four" and CUDA_VISIBLE_DEVICES=2,3 K=iris
#                (the four-GPU tests then need all four)
#   par-tests    every GPU test file but the emulated one at once, each a pytest process of its own on the
#                visible GPUs (test_ag_gemm_gpu.py split in five): on 2xH200 (2026-11-27) the longest took
#                306 s where the files one after another never finished in a call; TEST_LIMIT per process
#   ce-host      bench/rank0_view.py --source host on one GPU: ce_persistent's rank 0 with its peers' rows landing
#                by copy engine (pinned host copies) one shard after another, against the GEMM alone and the
#                copies alone ($CE_SHAPES, default 4096x2560x8192:nk; $CE_SET e.g. group_m=2; $EMU_WS ranks,
#                default 4; each shape ~90 s of set-up) -> $OUT/ce_host.json
#   cublas       the fused kernels' GEMM core against cuBLAS at one rank -> $OUT/gemm_vs_cublas.json
#   copy-sm      bench/copy_sm_probe.py: does a copy need SMs (host, same-device and, with 2+ GPUs visible,
#                peer copies beside a spinning kernel) -> $OUT/copy_sm_probe.json (issue 47: run it first on
#                a multi-GPU machine: a peer copy that needs SMs is starved by ce_persistent's grid)
#   example      examples/tp_block.py under torchrun: loss against the unsharded model, then the time per
#                step of autotaxer against --plain (S=$SEQ, H=$HIDDEN, bf16)
#   tune         autotaxer tune --world-size $WS over $SHAPES (default: the ag_gemm LLM shapes in both
#                weight layouts and the gemm_rs shapes), every non-experimental variant and the BSP forms,
#                $TRIALS trials (default 24) and at least $SAMPLED (default 16) sampler draws after the
#                seeds, eager timing -> $STATE/ws$WS.db; resumable: carry $STATE and run the step again;
#                $VARIANTS names the variants (of either op; the BSP forms always), e.g. at 4 GPUs
#                torch_fused,copy_engine,ce_fanout,ce_pull (the TP4 layer's 1.14-1.18x in graphs, 2026-11-28);
#                SPLIT_M tunes the keys with M >= SPLIT_M first (step NAME_large, LIMIT_LARGE s, default 240)
#                with $VARIANTS_LARGE, e.g. SPLIT_M=4096 VARIANTS_LARGE=torch_fused,copy_engine: on 2xH200
#                (2026-11-28) no Iris variant came within 2% of a key's best from M=4096, and its trials
#                cost ~1 s each (a key keeps the variants it was first tuned with: resume with the same split)
#   tune-graph   the same with --timing graph -> $STATE/ws${WS}_graph.db
#   export       both databases' records -> $OUT/new_ws$WS.json and $OUT/new_ws${WS}_graph.json, merged
#                into the shipped tables (autotaxer merge --all: the re-tune replaces what it covers)
#                -> $OUT/nvidia-h200_ws$WS.json and $OUT/nvidia-h200_ws${WS}_graph.json
#   bench        autotaxer bench --world-size $WS over $SHAPES: every BSP form, the communication and the
#                GEMM alone, every variant at its graph-tuned configuration, dispatch with the merged graph
#                table, torch's fused ops -> $OUT/bench_ws$WS.json (eager and graph timings of each); the
#                peers (torch's fused op called directly, Iris' stock kernel) only with PEERS=--peers: the
#                torch_fused variant already times torch's op (the peers' illegal memory access of
#                2026-11-28 was the timing chain's, fixed: see autotaxer.measure.Chain)
#   layer        bench/layer.py at TP$WS with the warm-up in the launch and no shipped table ($CASES,
#                default fwd:4096,graph:1024; $MODES; $BUDGET s a mode and case, default 50)
#                -> $OUT/layer.json, its database $OUT/layer.sqlite
#   layer-merge  the `layer` step's warm-up decisions into the shipped tables, each record into the table of
#                its timing (export --timing; merge --all): on 2xH200 (2026-11-29) a 180 s warm-up decided with
#                the in-step check's tie rule ran 1-2% ahead of records decided before it
#                -> $OUT/nvidia-h200_ws$WS.json, $OUT/nvidia-h200_ws${WS}_graph.json
#   layer-check  the re-tuned eager table judged in the model's step (issue 51): bench/layer.py's warm-up on
#                $STATE/ws$WS.db over the training cases S = 256 ... 16384 checks each winner `autotaxer tune`
#                stored (kept, or stored again as its fastest form) and tunes what is missing ($CASES, $MODES,
#                $BUDGET s a mode and case, default 120) -> $OUT/layer-check.json; run `export` after it
#   layer-check-graph  the same for the graph-timed table ($STATE/ws${WS}_graph.db) over the graph cases,
#                each arm's step captured and replayed (--check-graphs)
#   agreement    bench/calls.py agreement over that run -> $OUT/agreement.json
#   served       bench/calls.py served-vs-trial on $WS GPUs (default gemm_rs M=4096 N=K=8192 copy_engine;
#                $SERVED_ARGS adds its options, e.g. --op ag_gemm --N 5120 --params '{...}')
#                -> $OUT/served_vs_trial.json
#   timeline     bench/timeline.py on $WS GPUs: the device timeline of bsp, torch_fused and the copy-engine
#                variants (ag: copy_engine, ce_pull, ce_persistent, ce_fanout from 3 GPUs) at the TP4 layer's M=4096 keys (ag N=2560 and 14336, rs K=8192
#                and 28672) -> $OUT/timeline_*.json (issue 47: which stream waits on what)
#   overhead     bench/dispatch_overhead.py at world size $WS (5000 calls) -> $OUT/overhead.json
#   host         bench/host_probe.py on $WS GPUs: a copy-engine call's host time by building block, eager
#                against its CUDA-graph replay -> $OUT/host_probe_ws$WS.json
#   bound-ab     the shared peer waits (push, pull, push_tma, the copy-engine lanes' `done`) reading their
#                bound after 50 us against after 10 ms ($AUTOTAXER_WAIT_CHECK_AFTER_US=50 / 10000; 10 ms the
#                default since this A/B, bench/results/2026-11-29_wait_bound_ab_h200x2):
#                autotaxer bench of $AB_SHAPES (default bench/shapes/wait_bound_ab.csv) four times, 50us 10ms
#                10ms 50us, dispatch with the shipped graph table, the variants at their configurations in
#                $STATE/ws${WS}_graph.db (carry the 2026-11-29 re-tune's, its raw.tar.xz data/retune_ws2_graph.db)
#                -> $OUT/bound_ab_*.json and two tables (graph, eager) printed by bench/ab_table.py
#   save         the databases under $STATE checkpointed (their -wal folded in) and copied to $OUT: a copy of
#                the .db file alone misses what a crashed process left in its -wal (2026-11-28: a check's
#                verdicts lost that way)
#   pack         keep what comes back from $OUT within the device tool's limit: SQLite files checkpointed
#                (no -wal/-shm file needed), the first 7 files named in $KEEP kept (name the databases
#                first: 8 files come back, and on 2026-11-28 a database named 11th did not), the rest
#                packed in misc.tgz
# SHAPES may name several files (space-separated); they are concatenated into one. The keys a model calls
# (the layer benchmark's training step, S = 256 ... 16384): SHAPES=examples/shapes_llama70b_layer_ws$WS.csv. LIMIT overrides the tune
# steps' time limit (default 540 s), BENCH_LIMIT that of bench (default 540); GPU the model exported
# (default nvidia-h200). Dry run on one GPU (2026-11-25, H100): WS=1 with a 2-row shapes file, tune to
# bench in 190 s.

device_env() {
    [ -n "${AUTOTAXER_DEVICE_ENV:-}" ] && return 0
    export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
    local site_deps=/tmp/site site_pkg
    site_pkg=$(mktemp -d /tmp/autotaxer_site.XXXX)
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$site_deps" \
        .whl/*.whl || { echo "wheel install failed" >&2; return 1; }
    python3 -m pip install -q --no-deps --no-index --no-build-isolation --target "$site_pkg" . \
        || { echo "package install failed" >&2; return 1; }
    export PYTHONPATH="$site_pkg:$site_deps" OUT="${OUT:-/tmp/out}" AUTOTAXER_DEVICE_ENV=1
    mkdir -p "$OUT"
}

# step NAME LIMIT_S COMMAND...: run COMMAND under `timeout` (SIGINT first: the tuner records its running
# trial as interrupted and exits), its output in $OUT/NAME.log; "NAME rc=.. seconds | last log line" is
# added to the summary.
summary=()
step() {
    local name=$1 limit=$2
    shift 2
    local t0=$SECONDS
    timeout -s INT -k 20 "$limit" "$@" > "$OUT/$name.log" 2>&1
    local rc=$?
    summary+=("$name rc=$rc $((SECONDS - t0))s | $(tail -n 1 "$OUT/$name.log")")
}

if [ "${BASH_SOURCE[0]}" != "$0" ]; then  # sourced: the set-up alone
    device_env
    return $?
fi
set -u
device_env || exit 1
WS="${WS:-2}"
STATE="${STATE:-$OUT}"
SHAPES="${SHAPES:-examples/shapes_llm.csv examples/shapes_llm_linear.csv examples/shapes_gemm_rs.csv}"
DB="sqlite:///$STATE/ws$WS.db"
DB_GRAPH="sqlite:///$STATE/ws${WS}_graph.db"
SEQ="${SEQ:-4096}" HIDDEN="${HIDDEN:-8192}"
mkdir -p "$STATE"
nvidia-smi -L > "$OUT/gpu.txt" 2>&1

shapes_file() {  # one shapes file with every row of $SHAPES (comments and each file's header dropped)
    local f=$STATE/shapes_ws$WS.csv
    echo "op,M,N,K,dtype,gather_dim,scatter_dim,b_layout" > "$f"
    for s in $SHAPES; do
        python3 -P - "$s" >> "$f" <<'PY'
import csv, sys
rows = [line for line in open(sys.argv[1]) if line.strip() and not line.lstrip().startswith("#")]
for r in csv.DictReader(rows):
    print(",".join(r.get(k) or "" for k in ("op", "M", "N", "K", "dtype", "gather_dim", "scatter_dim", "b_layout")))
PY
    done
    echo "$f"
}

tests() {  # tests LIMIT_S FILE...: each file a step ($TEST_LIMIT overrides LIMIT_S, $K selects with -k)
    local limit=${TEST_LIMIT:-$1}
    shift
    for f in "$@"; do
        step "tests_$(basename "$f" .py)" "$limit" python3 -P -m pytest -q -x -p no:cacheprovider -rs "$f" \
            ${K:+-k "$K"}
    done
}

# par_tests LIMIT_S: every GPU test file but the N-rank emulation as a pytest process of its own, all at once on
# the visible GPUs (correctness only: sharing the GPUs slows them, it does not change what they check), with
# tests/ops/test_ag_gemm_gpu.py split in five; "par_NAME rc=.. seconds | pytest's last line" a process in
# the summary, the logs packed in $OUT/par_tests_logs.tgz (one file: the device tool returns few).
par_tests() {
    local limit=$1 spec name file k m
    local specs=(
        "ag_every_bf16|tests/ops/test_ag_gemm_gpu.py|every_variant and bf16"
        "ag_every_fp16|tests/ops/test_ag_gemm_gpu.py|every_variant and fp16"
        "ag_iris_bf16|tests/ops/test_ag_gemm_gpu.py|iris_fused and bf16"
        "ag_iris_fp16|tests/ops/test_ag_gemm_gpu.py|iris_fused and fp16"
        "ag_rest|tests/ops/test_ag_gemm_gpu.py|not every_variant and not iris_fused"
    )
    for file in $(find tests -name "*_gpu.py" | sort); do
        case "$file" in */test_ag_gemm_gpu.py | */test_emulated_ranks_gpu.py) continue ;; esac
        specs+=("$(basename "$file" .py)|$file|")
    done
    specs+=("test_measure|tests/tuner/test_measure.py||gpu")  # its GPU tests (-m gpu)
    mkdir -p "$OUT/par"
    for spec in "${specs[@]}"; do
        IFS='|' read -r name file k m <<< "$spec"
        (
            t0=$SECONDS
            mkdir -p "/tmp/par_home/$name"
            HOME="/tmp/par_home/$name" timeout -s INT -k 20 "$limit" python3 -P -m pytest -q -p no:cacheprovider \
                -rs "$file" ${k:+-k "$k"} ${m:+-m "$m"} > "$OUT/par/$name.log" 2>&1
            echo "par_$name rc=$? $((SECONDS - t0))s | $(tail -n 1 "$OUT/par/$name.log")" > "$OUT/par/$name.sum"
        ) &
    done
    wait
    for spec in "${specs[@]}"; do
        IFS='|' read -r name _ <<< "$spec"
        summary+=("$(cat "$OUT/par/$name.sum")")
    done
    tar czf "$OUT/par_tests_logs.tgz" -C "$OUT/par" . && rm -rf "$OUT/par"
}

tune_ws() {  # tune_ws NAME TIMING DB
    local shapes
    shapes=$(shapes_file)
    if [ -n "${SPLIT_M:-}" ]; then  # the keys with M >= SPLIT_M first, with $VARIANTS_LARGE
        awk -F, -v m="$SPLIT_M" 'NR == 1 || $2 >= m' "$shapes" > "$shapes.large"
        awk -F, -v m="$SPLIT_M" 'NR == 1 || $2 < m' "$shapes" > "$shapes.small"
        tune_cmd "$1_large" "${LIMIT_LARGE:-240}" "$2" "$3" "$shapes.large" "${VARIANTS_LARGE:-${VARIANTS:-}}"
        shapes=$shapes.small
    fi
    tune_cmd "$1" "${LIMIT:-540}" "$2" "$3" "$shapes" "${VARIANTS:-}"
}

tune_cmd() {  # tune_cmd NAME LIMIT_S TIMING DB SHAPES VARIANTS
    step "$1" "$2" python3 -P -m autotaxer tune --world-size "$WS" --shapes "$5" --trials "${TRIALS:-24}" \
        --sampled "${SAMPLED:-16}" --db "$4" --jsonl --trial-timeout 60 --seed 0 --timing "$3" \
        ${6:+--variants "$6"}
}

export_ws() {  # export_ws NAME DB SUFFIX [TIMING [PREFIX]]: DB's records (only those of TIMING when given)
    # -> $OUT/${PREFIX:-new}_ws$WS$SUFFIX.json, merged into the shipped table -> $OUT/nvidia-h200_ws$WS$SUFFIX.json
    local part="$OUT/${5:-new}_ws$WS$3.json"
    step "$1" 60 python3 -P -m autotaxer export --db "$2" --gpu "${GPU:-nvidia-h200}" --world-size "$WS" \
        ${4:+--timing "$4"} --out "$part"
    local shipped="tuning_db/nvidia-h200_ws$WS$3.json"
    if [ -f "$shipped" ]; then
        step "merge_$1" 60 python3 -P -m autotaxer merge "$shipped" "$part" --all \
            --out "$OUT/nvidia-h200_ws$WS$3.json"
    else
        cp "$part" "$OUT/nvidia-h200_ws$WS$3.json"
    fi
}

checkpoint() {  # checkpoint DB...: each SQLite file's -wal folded into it, journal mode DELETE
    local db
    for db in "$@"; do
        [ -f "$db" ] || continue
        python3 -c "import sqlite3, sys; c = sqlite3.connect(sys.argv[1]); c.execute('PRAGMA wal_checkpoint(TRUNCATE)'); c.execute('PRAGMA journal_mode=DELETE'); c.close()" "$db"
    done
}

pack() {  # checkpoint SQLite files, keep $KEEP, pack the rest of $OUT in misc.tgz
    (
        cd "$OUT" || exit 1
        checkpoint *.sqlite *.db
        # at most 8 files come back from $OUT: the first 7 of $KEEP that exist (in its order), misc.tgz
        local kept=() rest=() f
        for f in ${KEEP:-}; do
            [ -f "$f" ] || continue
            if [ ${#kept[@]} -lt 7 ]; then kept+=("$f"); else rest+=("$f"); echo "pack: $f packed in misc.tgz (8 files come back)" >&2; fi
        done
        for f in *; do
            [ -f "$f" ] || continue
            case " ${kept[*]} " in *" $f "*) ;; *) case " ${rest[*]} " in *" $f "*) ;; *) rest+=("$f") ;; esac ;; esac
        done
        if [ ${#rest[@]} -gt 0 ]; then
            tar czf misc.tgz "${rest[@]}" && rm -f "${rest[@]}"
        fi
        ls -la
    )
}

for s in "$@"; do
    case "$s" in
    checks)
        tests 240 tests/ops/test_copy_engine_gpu.py tests/runtime/test_dispatch_gpu.py \
            tests/ops/test_flash_decode_gpu.py tests/ops/test_ag_gemm_gpu.py
        ;;
    tests)
        tests 280 tests/ops/test_ag_gemm_gpu.py tests/runtime/test_integration_gpu.py tests/ops/test_gemm_rs_gpu.py \
            tests/ops/test_bsp_symm_gpu.py tests/runtime/test_dispatch_gpu.py tests/ops/test_copy_engine_gpu.py
        ;;
    ag-tests) tests 540 tests/ops/test_ag_gemm_gpu.py ;;
    par-tests) par_tests "${TEST_LIMIT:-540}" ;;
    gpu) step gpu "${LIMIT:-400}" python3 -P -m pytest -q -p no:cacheprovider -rs -m "gpu and not emulated" tests ;;
    emulated)
        step emulated "${LIMIT:-400}" python3 -P -m pytest -q -p no:cacheprovider -rs \
            tests/ops/test_emulated_ranks_gpu.py ${K:+-k "$K"}
        ;;
    copy-sm)
        step copy_sm 120 python3 -P bench/copy_sm_probe.py --json-out "$OUT/copy_sm_probe.json"
        ;;
    ce-host)
        step ce_host "${LIMIT:-300}" env CUDA_DEVICE_MAX_CONNECTIONS=32 python3 -P bench/rank0_view.py \
            --world-size "${EMU_WS:-4}" --source host --shapes "${CE_SHAPES:-4096x2560x8192:nk}" --polls load \
            --delay-us 0 --configs 1 --signals memop --calls 10 ${CE_SET:+--set "$CE_SET"} \
            --json-out "$OUT/ce_host.json"
        ;;
    cublas)
        step cublas 240 python3 -P bench/gemm_vs_cublas.py --fused --tma --shapes 8192x8192 --ms 256,1024,4096 \
            --out "$OUT/gemm_vs_cublas.json"
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
            --world-size "$WS" --shapes "$(shapes_file)" --device cuda --db "$DB_GRAPH" --dispatch-timing graph \
            --max-configs 3 --iters 10 --samples 7 --peer-timeout 30 ${PEERS:---no-peers} --out "$OUT/bench_ws$WS.json"
        ;;
    bound-ab)
        ab_runs=()
        for name in 50us_1 10ms_1 10ms_2 50us_2; do
            after_us=$([ "${name%_*}" = 10ms ] && echo 10000 || echo 50)
            step "bound_ab_$name" "${BENCH_LIMIT:-150}" env AUTOTAXER_WAIT_CHECK_AFTER_US="$after_us" \
                AUTOTAXER_TABLE="tuning_db/nvidia-h200_ws${WS}_graph.json" python3 -P -m autotaxer bench \
                --world-size "$WS" --shapes "${AB_SHAPES:-bench/shapes/wait_bound_ab.csv}" --device cuda \
                --db "$DB_GRAPH" --dispatch-timing graph --variants "${VARIANTS:-push,pull,push_tma,torch_fused,copy_engine}" \
                --max-configs 1 --no-peers --out "$OUT/bound_ab_$name.json"
            ab_runs+=("$name=$OUT/bound_ab_$name.json.rows.jsonl")
        done
        for mode in graph eager; do
            step "bound_ab_$mode" 30 python3 -P bench/ab_table.py --mode "$mode" --entries bsp,dispatch,push,pull "${ab_runs[@]}"
            echo "bound-ab, $mode timing (us):" && cat "$OUT/bound_ab_$mode.log"
        done
        ;;
    layer)
        step layer "${LIMIT:-500}" torchrun --nproc-per-node "$WS" bench/layer.py --cases "${CASES:-fwd:4096,graph:1024}" \
            --modes "${MODES:-plain_compile,autotaxer_compile,functions_compile,async_tp,async_tp_autotaxer,ceiling}" \
            --no-shipped --warmup-budget "${BUDGET:-50}" --db "sqlite:///$OUT/layer.sqlite" --reps 10 \
            --out "$OUT/layer.json"
        ;;
    layer-merge)
        export_ws layer_export "sqlite:///$OUT/layer.sqlite" "" eager layer
        export_ws layer_export_graph "sqlite:///$OUT/layer.sqlite" _graph graph layer
        ;;
    layer-check | layer-check-graph)
        # the re-tuned table judged in the model's step before export (issue 51): the layer's warm-up on the
        # tuning database checks every winner `autotaxer tune` stored there (and tunes what is missing)
        if [ "$s" = layer-check ]; then db=$DB cases=train:256,train:1024,train:4096,train:8192,train:16384 graphs=
        else db=$DB_GRAPH cases=graph:256,graph:1024,graph:4096,graph:8192,graph:16384 graphs=--check-graphs; fi
        step "$s" "${LIMIT:-540}" torchrun --nproc-per-node "$WS" bench/layer.py --cases "${CASES:-$cases}" \
            --modes "${MODES:-plain_compile,autotaxer_compile}" --no-shipped --warmup-budget "${BUDGET:-120}" \
            --db "$db" --reps 5 --out "$OUT/$s.json" $graphs
        ;;
    agreement)
        step agreement 60 python3 -P bench/calls.py agreement --layer "$OUT/layer.json" \
            --db "sqlite:///$OUT/layer.sqlite" --out "$OUT/agreement.json"
        ;;
    served)
        # shellcheck disable=SC2086  # SERVED_ARGS: several options
        step served 150 torchrun --nproc-per-node "$WS" bench/calls.py served-vs-trial ${SERVED_ARGS:-} \
            --json-out "$OUT/served_vs_trial.json"
        ;;
    timeline)
        fan=$([ "$WS" -ge 3 ] && echo ,ce_fanout)
        for nk in 2560 14336; do
            step "timeline_ag_n$nk" 120 torchrun --nproc-per-node "$WS" bench/timeline.py --op ag_gemm --M 4096 \
                --N "$nk" --K 8192 --entries "bsp,torch_fused,copy_engine,ce_pull,ce_persistent$fan" --json-out "$OUT/timeline_ag_n$nk.json"
        done
        for k in 8192 28672; do
            step "timeline_rs_k$k" 120 torchrun --nproc-per-node "$WS" bench/timeline.py --op gemm_rs --M 4096 \
                --N 8192 --K "$k" --entries bsp,torch_fused,copy_engine --json-out "$OUT/timeline_rs_k$k.json"
        done
        ;;
    overhead)
        step overhead 120 python3 -P bench/dispatch_overhead.py --device cuda --world-size "$WS" --iters 5000 \
            --json "$OUT/overhead.json"
        ;;
    host)
        step "host_ws$WS" 150 torchrun --nproc-per-node "$WS" bench/host_probe.py --json-out "$OUT/host_probe_ws$WS.json"
        ;;
    save)
        checkpoint "$STATE"/*.db
        if ! [ "$STATE" -ef "$OUT" ]; then  # STATE defaults to OUT: then they are there already
            for db in "$STATE"/*.db; do [ -f "$db" ] && cp "$db" "$OUT/"; done
        fi
        summary+=("save: $(cd "$STATE" && ls ./*.db 2>/dev/null | tr '\n' ' ')")
        ;;
    pack) pack ;;
    *) summary+=("$s: unknown step") ;;
    esac
done
printf '%s\n' "${summary[@]}"
