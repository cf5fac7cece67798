#!/usr/bin/env bash
set -u
source bench/device_env.sh || exit 1
nvidia-smi --query-gpu=name --format=csv,noheader
R=bench/results/2026-11-26_layer_ws2_h200
if nvidia-smi --query-gpu=name --format=csv,noheader | head -1 | grep -q H200; then
  CASE=train:4096 OFFLINE_TABLE=$R/nvidia-h200_ws2_layer.json OFFLINE_LOG=$R/tune_layer_keys.jsonl.gz BUDGET=170 bash bench/warmup_layer.sh
else
  CASE=train:4096 BUDGET=150 OFFLINE_S=15 bash bench/warmup_layer.sh
fi
ls -la $OUT/warmup_layer
tail -n 45 $OUT/warmup.log; tail -n 8 $OUT/overhead.log
