#!/usr/bin/env bash
# The second device call of 2026-11-27 (4xH200): (1) ce_persistent's stall A/B at world size 4 (its waits'
# bound read on every poll, as in the first run, against once); (2) the chained-timing GPU test; (3) the
# layer at TP2 on GPUs 0,1 after the warm-up fix (a key the in-step check decided is not resumed), while
# the integration GPU tests run on GPUs 2,3. Repo root, carrying .whl.
set -u
source bench/device.sh || exit 1
nvidia-smi --query-gpu=name --format=csv,noheader | head -1
for r in every once; do
  AUTOTAXER_CE_PERSISTENT_BOUND_READS=$r timeout 110 python3 -P -m autotaxer bench --world-size 4 \
    --shapes bench/shapes/issue47_stall.csv --no-peers --no-dispatch --variants bsp,torch_fused,ce_persistent \
    --max-configs 2 --chain back-to-back --iters 10 --samples 3 --out $OUT/stall_$r.json > $OUT/stall.log 2>&1
  echo "stall $r rc=$?"; rm -f $OUT/stall_$r.json.rows.jsonl
done
CUDA_VISIBLE_DEVICES=0 timeout 60 python3 -P -m pytest -q -p no:cacheprovider -m gpu tests/tuner/test_measure.py \
  > $OUT/tests.log 2>&1; echo "test_measure rc=$? $(tail -n 1 $OUT/tests.log)"
(
  export CUDA_VISIBLE_DEVICES=2,3
  timeout 330 python3 -P -m pytest -q -p no:cacheprovider -rs -m gpu tests/runtime/test_integration_gpu.py \
    >> $OUT/tests.log 2>&1
  echo "test_integration_gpu rc=$?" >> $OUT/tests.log
) &
tests=$!
CUDA_VISIBLE_DEVICES=0,1 timeout -s INT -k 20 ${LAYER_LIMIT:-330} torchrun --nproc-per-node 2 --master-port 29611 \
  bench/layer.py --cases ${CASES:-fwd:4096,graph:256} \
  --modes plain_compile,autotaxer_compile,functions_compile,ceiling \
  --no-shipped --warmup-budget ${BUDGET:-45} --db sqlite:///$OUT/layer.sqlite --reps 10 --out $OUT/layer.json \
  > $OUT/layer.log 2>&1
echo "layer rc=$?"
wait $tests
python3 - <<'PY'
import json, os
for r in ("every", "once"):
    p = f"{os.environ['OUT']}/stall_{r}.json"
    if not os.path.exists(p):
        print(r, "no result"); continue
    for row in json.load(open(p)).get("rows", []):
        v = row.get("variants", {})
        cp = v.get("ce_persistent", {})
        tried = [round(t.get("eager") or -1) for t in cp.get("tried", [])]
        tf = v.get("torch_fused", {})
        print(r, row.get("M"), row.get("N"), row.get("b_layout"), "bsp", row.get("bsp"), "torch_fused",
              tf.get("eager"), tf.get("graph"), "ce_persistent tried", tried, "best", cp.get("eager"), cp.get("graph"))
PY
grep -E "warm-up|\[[0-9]+/[0-9]+\]|check|rror" $OUT/layer.log | grep -v "INFO  \[Iris\]\|Warning" | head -30
sed -n '/^ms (x/,$p' $OUT/layer.log | head -40
grep -E "passed|failed|rc=|Error" $OUT/tests.log | tail -8
