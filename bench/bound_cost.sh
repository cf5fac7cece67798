#!/usr/bin/env bash
# The cost of bounding every wait on a peer (issue 35): the tree before it ($OLD) against this one, side by
# side in one call on a 2-GPU machine, in about 4 minutes:
#   1. the fused kernels at one rank against cuBLAS (bench/gemm_vs_cublas.py --fused --tma, N=K=8192): the
#      GEMM core with the bounded waits compiled in; old on GPU 0 and new on GPU 1 at once, then swapped;
#   2. the 2-GPU per-op bench (autotaxer bench --world-size 2) of both ops on a handful of shapes, old then
#      new (push and push_tma of ag_gemm and gemm_rs, beside every BSP form);
# then a short table (bench/bound_cost_table.py) last; JSON and logs under $OUT.
# $OLD is a tree made like ab_device.sh's reference (git-ignored; name it in the device call's carry):
#   mkdir bound_old && git archive REV pyproject.toml README.md autotaxer kernels bench migrations tuning_db \
#     examples | tar -x -C bound_old
# Usage (device, repo root): OLD=bound_old bash bench/bound_cost.sh
# Knobs: CUBLAS_M (default 256,1024,4096), VARIANTS (push,push_tma), STEP_LIMIT seconds per step (100).
set -u
source bench/device_env.sh || exit 1
: "${OLD:?the old tree (see the header)}" "${CUBLAS_M:=256,1024,4096}" "${VARIANTS:=push,push_tma}"
: "${STEP_LIMIT:=100}"
site_old=$(mktemp -d /tmp/bound_old.XXXX)
python3 -m pip install -q --no-deps --no-index --no-build-isolation --target "$site_old" "./$OLD" || exit 1
site_new=${PYTHONPATH%%:*}
deps=${PYTHONPATH#*:}
run_old() { PYTHONPATH="$site_old:$deps" timeout "$STEP_LIMIT" python3 -P "$@"; }
run_new() { PYTHONPATH="$site_new:$deps" timeout "$STEP_LIMIT" python3 -P "$@"; }

# 1. the GEMM core at one rank, both trees at once on different GPUs, then swapped
gvc=(--fused --tma --shapes 8192x8192 --ms "$CUBLAS_M" --configs "128,128,64,8,4,4,0;128,256,64,8,8,3,0")
CUDA_VISIBLE_DEVICES=0 run_old "$OLD/bench/gemm_vs_cublas.py" "${gvc[@]}" --out "$OUT/cublas_old0.json" \
    > "$OUT/cublas_old0.log" 2>&1 &
CUDA_VISIBLE_DEVICES=1 run_new bench/gemm_vs_cublas.py "${gvc[@]}" --out "$OUT/cublas_new1.json" \
    > "$OUT/cublas_new1.log" 2>&1
wait
CUDA_VISIBLE_DEVICES=1 run_old "$OLD/bench/gemm_vs_cublas.py" "${gvc[@]}" --out "$OUT/cublas_old1.json" \
    > "$OUT/cublas_old1.log" 2>&1 &
CUDA_VISIBLE_DEVICES=0 run_new bench/gemm_vs_cublas.py "${gvc[@]}" --out "$OUT/cublas_new0.json" \
    > "$OUT/cublas_new0.log" 2>&1
wait

# 2. the per-op bench on 2 GPUs: ag_gemm at both layouts, gemm_rs (the shipped tables' shapes)
shapes="$OUT/bound_shapes.csv"
cat > "$shapes" <<'CSV'
op,M,N,K,dtype,gather_dim,scatter_dim,b_layout
ag_gemm,256,8192,8192,bf16,0,,kn
ag_gemm,1024,8192,8192,bf16,0,,kn
ag_gemm,512,8192,8192,bf16,1,,kn
gemm_rs,1024,8192,8192,bf16,,0,nk
CSV
bench=(-m autotaxer bench --world-size 2 --shapes "$shapes" --variants "$VARIANTS" --no-peers --no-dispatch
    --max-configs 1 --iters 10 --samples 7)
run_old "${bench[@]}" --out "$OUT/bench_old.json" > "$OUT/bench_old.log" 2>&1
run_new "${bench[@]}" --out "$OUT/bench_new.json" > "$OUT/bench_new.log" 2>&1

grep -h "WRONG\|Error\|error" "$OUT"/cublas_*.log "$OUT"/bench_*.log | head -20
PYTHONPATH="$site_new:$deps" python3 -P bench/bound_cost_table.py --dir "$OUT" --out "$OUT/bound_cost.json"
