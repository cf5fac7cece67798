#!/usr/bin/env bash
# One call on a one-GPU machine (issue 26, item 5): the N-rank emulation tests (the fused kernels at 4 and
# 8 ranks, the copy-engine family of both ops at 2, 4 and 8), the one-rank GPU tests of gemm_rs, then the
# fused kernels' GEMM core against cuBLAS. Logs and JSON under $OUT, a summary line per step printed last:
#   source bench/device_env.sh && bash bench/emulated_ranks_device.sh [STEP ...]
# Steps: emulated (default), gemm_rs, gpu (every other GPU test, at the visible GPUs' world size), cublas.
set -u
: "${OUT:?source bench/device_env.sh first}"
# shellcheck source=bench/_step.sh
source "$(dirname "$0")/_step.sh"
export TRITON_CACHE_DIR="${TRITON_CACHE_DIR:-/tmp/triton_cache}"
nvidia-smi -L > "$OUT/gpu.txt" 2>&1
steps=("$@")
[ ${#steps[@]} -eq 0 ] && steps=(emulated)
for s in "${steps[@]}"; do
    case "$s" in
        emulated) step emulated "${LIMIT:-400}" python3 -P -m pytest -q -p no:cacheprovider -rs \
                      tests/ops/test_emulated_ranks_gpu.py ${K:+-k "$K"} ;;
        gpu) step gpu "${LIMIT:-400}" python3 -P -m pytest -q -p no:cacheprovider -rs -m "gpu and not emulated" tests ;;
        gemm_rs) step gemm_rs 200 python3 -P -m pytest -q -p no:cacheprovider -rs tests/ops/test_gemm_rs_gpu.py ;;
        cublas) step cublas 240 python3 -P bench/gemm_vs_cublas.py --fused --tma --shapes 8192x8192 \
                    --ms 256,1024,4096 --out "$OUT/gemm_vs_cublas.json" ;;
        *) echo "unknown step $s" >&2; exit 2 ;;
    esac
done
printf '%s\n' "${summary[@]}"
