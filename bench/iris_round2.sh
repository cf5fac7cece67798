#!/usr/bin/env bash
# Round 2 of the Iris SM kernels (pull, push) on 2 GPUs, in at most ~5 minutes:
#   1. install the package into /tmp/site_r2 (autotaxer.kernels is only importable from an install),
#   2. the 2-GPU correctness tests of pull and push (bf16 + fp16; several calls, CUDA-graph replay),
#   3. a focused sweep of pull/push vs BSP at N=K=8192, M in {16, 256, 1024, 4096}, both layouts
#      (configs pruned by the variants' shared-memory check), JSON under $OUT, a short table last.
# Usage (repository root, 2 GPUs): OUT=/some/dir bash bench/iris_round2.sh
set -uo pipefail
OUT=${OUT:-/tmp/iris_round2}
mkdir -p "$OUT"
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1
python3 -m pip install -q --no-deps --no-index --no-build-isolation --target /tmp/site_r2 . >"$OUT/install.log" 2>&1 \
    || { tail -20 "$OUT/install.log"; exit 1; }
PY="env PYTHONPATH=/tmp/site_r2:/tmp/site python3 -P"
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee "$OUT/device.txt"
$PY -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)" | tee -a "$OUT/device.txt"

# 2. correctness (a time limit per dtype: a hang shows as rc 124, not as a stuck machine)
test_rc=0
for dtype in bf16 fp16; do
    timeout 90 $PY -m pytest -q -x -p no:cacheprovider tests/ops/test_ag_gemm_gpu.py \
        -k "iris_fused and $dtype" >"$OUT/tests_$dtype.log" 2>&1
    rc=$?
    echo "tests $dtype: rc=$rc ($(tail -1 "$OUT/tests_$dtype.log"))"
    [ "$rc" -ne 0 ] && test_rc=$rc && tail -30 "$OUT/tests_$dtype.log"
done

# 3. the sweep (prints one JSON row per config as it goes, then the table)
timeout 180 $PY bench/sweep_iris.py --out "$OUT/sweep_iris_round2.json" --ms 16,256,1024,4096 --timeout 170 \
    --n 8192 --k 8192 --variants pull,push >"$OUT/sweep.log" 2>&1
sweep_rc=$?
grep -c '"graph_ms"' "$OUT/sweep.log" | sed 's/^/timed configs: /'
grep '"error"' "$OUT/sweep.log" | head -5
echo "sweep rc=$sweep_rc"
sed -n '/^gd /,$p' "$OUT/sweep.log"
exit $(( test_rc != 0 ? test_rc : sweep_rc ))
