# Device calls on nvidia-h200-x2 (2x H200), 2026-11-28, from the repository root (main at d11789d + this
# session's CPU work), carrying .whl and devrun/ (the scripts, devrun/state/ws2.db and ws2_graph.db from
# 2026-11-28_ws2_tables_h200x2/raw.tar.xz). Scripts in raw.tar.xz: scripts/call5.sh ... call9.sh.
export WS=2 STATE=devrun/state
source bench/device.sh
# Call 5: the graph tune's last keys, both tables exported and merged, torch_fused's GPU tests, the graph
# table in the step at S=256
SHAPES=examples/shapes_llama70b_layer_ws2.csv SPLIT_M=4096 VARIANTS_LARGE=torch_fused,copy_engine \
    LIMIT_LARGE=45 LIMIT=150 TRIALS=24 SAMPLED=16 bash bench/device.sh tune-graph
bash bench/device.sh export
python3 -P -m pytest -q -p no:cacheprovider -rs -m gpu tests/ops/test_torch_fused_gpu.py
CASES=graph:256 BUDGET=60 LIMIT=438 bash bench/device.sh layer-check-graph
# Call 6: the eager table in the training step, then export
CASES=train:1024,train:4096 BUDGET=90 LIMIT=450 bash bench/device.sh layer-check
bash bench/device.sh export
# Call 7: bench with the stock kernels (then the default): crashed on the first row
SHAPES=scripts/mid_ws2.csv bash bench/device.sh bench
# Calls 8 and 9: bench without them (now the step's default), M = 1024/4096, then M = 256
AUTOTAXER_TABLE=devrun/nvidia-h200_ws2_graph.json python3 -P -m autotaxer bench --world-size 2 \
    --shapes scripts/mid_ws2.csv --device cuda --db sqlite:///devrun/state/ws2_graph.db --dispatch-timing graph \
    --max-configs 3 --iters 10 --samples 7 --peer-timeout 30 --no-peers --out bench_ws2_m1024_4096.json
# (the same with --shapes scripts/small256_ws2.csv --out bench_ws2_m256.json)
# Here (CPU): the record whose kernel hash no longer matched dropped from the eager table, the summary
python scripts/drop_stale.py tuning_db/nvidia-h200_ws2.json
python scripts/summarize_bench.py rows.jsonl   # rows.jsonl: both runs' .rows.jsonl concatenated
