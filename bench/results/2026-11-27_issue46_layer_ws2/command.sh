#!/usr/bin/env bash
# Issue 46 on a 4-GPU machine: the layer benchmark at TP2 on GPUs 0,1 (warm-up in the launch, no shipped
# table) while the GPU tests of the changed paths run on GPUs 2,3. Repo root, carrying .whl.
set -u
source bench/device.sh || exit 1
nvidia-smi --query-gpu=name --format=csv,noheader | head -1
(
  export CUDA_VISIBLE_DEVICES=2,3
  for f in tests/runtime/test_dispatch_gpu.py tests/test_async_tp_gpu.py tests/tuner/test_warmup_gpu.py \
           tests/tuner/test_measure.py tests/ops/test_copy_engine_gpu.py tests/runtime/test_integration_gpu.py; do
    n=$(basename "$f" .py)
    left=$(( ${TESTS_LIMIT:-480} - SECONDS )); [ "$left" -gt 20 ] || { echo "$n not run (time)" >> "$OUT/gpu_tests.txt"; continue; }
    timeout "$left" python3 -P -m pytest -q -p no:cacheprovider -rs -m gpu "$f" > "$OUT/t_$n.log" 2>&1
    echo "$n rc=$? $(tail -n 1 "$OUT/t_$n.log")" >> "$OUT/gpu_tests.txt"
  done
) &
tests=$!
CUDA_VISIBLE_DEVICES=0,1 timeout -s INT -k 20 ${LAYER_LIMIT:-500} torchrun --nproc-per-node 2 --master-port 29611 \
  bench/layer.py --cases ${CASES:-fwd:4096,graph:1024} \
  --modes plain_compile,autotaxer_compile,functions_compile,async_tp,async_tp_autotaxer,ceiling \
  --no-shipped --warmup-budget ${BUDGET:-50} --db sqlite:///$OUT/layer.sqlite --reps 10 --out $OUT/layer.json \
  > $OUT/layer.log 2>&1
echo "layer rc=$?"
wait $tests
grep -v "INFO  \[Iris\]\|RuntimeWarning\|warnings.warn" $OUT/layer.log | grep -E "warm-up|\[[0-9]+/[0-9]+\]|check|Error|error" | head -40
sed -n '/^ms (x/,$p' $OUT/layer.log | head -60
cat $OUT/gpu_tests.txt
