#!/usr/bin/env bash
set -u
source bench/device_env.sh || exit 1
nvidia-smi --query-gpu=name --format=csv,noheader | head -1
T=bench/results/2026-11-26_layer_ws2_h200/nvidia-h200_ws2_layer.json
nvidia-smi --query-gpu=name --format=csv,noheader | head -1 | grep -q H200 || T=""
timeout 80 python3 -P -m pytest -q -p no:cacheprovider tests/test_async_tp_gpu.py > $OUT/atp_tests.log 2>&1; echo "async_tp gpu tests rc=$? $(tail -n 1 $OUT/atp_tests.log)"
timeout -s INT -k 20 470 torchrun --nproc-per-node 2 bench/layer.py --cases fwd:256,train:4096,fwd:4096,train:8192 \
  --modes plain_compile,async_tp,async_tp_autotaxer,ceiling --tables "$T" --warmup-budget 60 \
  --db sqlite:///$OUT/atp.sqlite --reps 15 --out $OUT/atp_layer.json > $OUT/atp_layer.log 2>&1
echo "layer rc=$?"
grep -E "warm-up of|done at|\[[0-9]+/[0-9]+\]|Error|error" $OUT/atp_layer.log | head -30
sed -n '/^ms (x/,$p' $OUT/atp_layer.log
timeout -s INT -k 20 300 torchrun --nproc-per-node 2 bench/layer.py --cases train:4096,fwd:256 \
  --modes async_tp,async_tp_autotaxer --warmup-budget 110 \
  --db sqlite:///$OUT/atp_warm.sqlite --reps 15 --out $OUT/atp_layer_warm.json > $OUT/atp_layer_warm.log 2>&1
echo "layer warm rc=$?"
grep -E "warm-up of|done at|\[[0-9]+/[0-9]+\]|Error|error" $OUT/atp_layer_warm.log | head -30
sed -n '/^ms (x/,$p' $OUT/atp_layer_warm.log
