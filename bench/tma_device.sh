#!/usr/bin/env bash
# push_tma against push, cuBLAS and a shipped table, in one device call (carry .whl):
#   STEPS="cublas probe" M=256,512,1024 [PROBE=bench/probes/push_tma.json] [WS=2] [LAYOUTS=0,1]
#   [TABLE=tuning_db/nvidia-h200_ws2_graph.json] [TAG=name] bash bench/tma_device.sh
# cublas:    the one-rank kernels beside cuBLAS on GPU 0 (gemm_vs_cublas.py --fused --tma, N=K=8192);
# probe:     config_probe.py with $PROBE and $TABLE's record on $WS GPUs, plus push's producer steps alone;
# gpu_tests: the GPU tests matching $GPU_TESTS (-k; default push_tma) on 2 GPUs;
# gpu_tests4: every variant on 4 GPUs; check4: the same check for $VARIANTS (default
#            ce_fanout,push_tma) only, on 4 GPUs.
# Logs and JSON go to $OUT as ${TAG}step.*; prints the probe table and the step summary last.
source bench/device_env.sh || exit 1
source bench/_step.sh
STEPS=${STEPS:-"cublas probe"}
M=${M:-256,512,1024}
WS=${WS:-2}
TAG=${TAG:-}
CUBLAS_MS=${CUBLAS_MS:-256,512,1024,4096}
nvidia-smi --query-gpu=name --format=csv,noheader | head -2
for s in $STEPS; do
    case $s in
    cublas) CUDA_VISIBLE_DEVICES=0 step "${TAG}cublas" 300 python3 -P bench/gemm_vs_cublas.py --fused --tma \
        --shapes 8192x8192 --ms "$CUBLAS_MS" --out "$OUT/${TAG}cublas.json" ;;
    probe) step "${TAG}probe" 420 python3 -P bench/config_probe.py --configs "${PROBE:-bench/probes/push_tma.json}" \
        --table "${TABLE:-tuning_db/nvidia-h200_ws${WS}_graph.json}" --shapes 8192x8192 --m "$M" --producers \
        --world-size "$WS" --layouts "${LAYOUTS:-0,1}" --out "$OUT/${TAG}probe.json" ;;
    gpu_tests) step "${TAG}gpu_tests" 400 python3 -P -m pytest -q -x tests/ops/test_ag_gemm_gpu.py -k "${GPU_TESTS:-push_tma}" ;;
    gpu_tests4) step "${TAG}gpu_tests4" 400 python3 -P -m pytest -q -x tests/ops/test_ag_gemm_gpu.py -k four_gpus ;;
    check4) step "${TAG}check4" 300 python3 -P bench/check_variants_gpu.py --world-size 4 \
        --variants "${VARIANTS:-ce_fanout,push_tma}" ;;
    esac
done
grep -h "side by side\|cublas .*us" "$OUT/${TAG}cublas.log" 2>/dev/null | tail -30
grep " bsp " "$OUT/${TAG}probe.log" 2>/dev/null \
    | sed -E 's/"(block_k|group_m|row_chunks|k_chunks|prefetch_k)":[0-9]+,?//g; s/"block_//g; s/"num_//g'
tail -n 5 "$OUT/${TAG}gpu_tests.log" "$OUT/${TAG}gpu_tests4.log" "$OUT/${TAG}check4.log" 2>/dev/null
printf '%s\n' "${summary[@]}"
