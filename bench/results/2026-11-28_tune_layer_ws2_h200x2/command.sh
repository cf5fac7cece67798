# Four device calls on nvidia-h200-x2 (2x H200), from the repository root, carrying .whl and the scripts folder
# (in raw.tar.xz: scripts/call1.sh, call2.sh, ce_pull_check.py, ag_keys_ws2.csv) with the tuning database
# between calls (devrun/state/ws2.db; the tuner resumes where the last call stopped).
# Call 1: ce_pull's reference check (failed to start: no __main__ guard; fixed in call 2), then per op at ws2
export WS=2 STATE=devrun/state
source bench/device.sh
python3 -P -m autotaxer bench --world-size 2 --shapes scripts/ag_keys_ws2.csv --device cuda --no-peers --no-dispatch \
  --variants torch_fused,copy_engine,ce_pull --max-configs 3 --iters 10 --samples 7 \
  --db sqlite:///$OUT/bench_ce.sqlite --out $OUT/bench_ce_ws2.json
# every call: the eager tune of the layer's keys (issue 51), resumed, under LIMIT seconds (270, 400, 530, 340)
SHAPES=examples/shapes_llama70b_layer_ws2.csv LIMIT=270 TRIALS=24 SAMPLED=16 bash bench/device.sh tune
# Call 2: ce_pull at 2 GPUs, the every-variant check of tests/ops/test_ag_gemm_gpu.py restricted to it
python3 -P scripts/ce_pull_check.py 2
