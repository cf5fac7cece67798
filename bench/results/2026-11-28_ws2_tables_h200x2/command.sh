# Four device calls on nvidia-h200-x2 (2x H200), 2026-11-28, from the repository root at 49b9488 (+ the CPU
# work of this session not yet in it), carrying .whl and devrun/ (scripts, the shapes split, the tuning
# databases between calls: devrun/state/ws2.db, ws2_graph.db). Scripts and split shapes in raw.tar.xz.
# Call 1 (scripts/call1.sh): three GPU checks side by side (correctness only), then the eager tune resumed
export WS=2 STATE=devrun/state
source bench/device.sh
python3 -P -m pytest -q -m gpu tests/ops/test_torch_fused_gpu.py
python3 -P -m pytest -q -m gpu tests/tuner/test_warmup_gpu.py -k "one_gpu and graph"
python3 -P scripts/ce_pull_check.py 2
SHAPES=examples/shapes_llama70b_layer_ws2.csv LIMIT=$((540 - SECONDS)) TRIALS=24 SAMPLED=16 bash bench/device.sh tune
# Call 2 (scripts/call2.sh): the eager tune's last key, then the graph tune: M >= 4096 with torch_fused and
# copy_engine (+ the BSP forms), M <= 1024 with every default variant (the Iris ones included)
SHAPES=examples/shapes_llama70b_layer_ws2.csv LIMIT=150 TRIALS=24 SAMPLED=16 bash bench/device.sh tune
SHAPES=scripts/big_ws2.csv VARIANTS=torch_fused,copy_engine LIMIT=... TRIALS=24 SAMPLED=16 bash bench/device.sh tune-graph
SHAPES=scripts/small_ws2.csv LIMIT=... TRIALS=24 SAMPLED=16 bash bench/device.sh tune-graph
# Call 3 (scripts/call3.sh): the small keys resumed (220 s), then the graph table checked in the layer's step
SHAPES=scripts/small_ws2.csv LIMIT=220 TRIALS=24 SAMPLED=16 bash bench/device.sh tune-graph
CASES=graph:1024,graph:4096 BUDGET=60 LIMIT=... bash bench/device.sh layer-check-graph
# Call 4 (scripts/call4.sh): the small keys resumed (~190 s: one key finished)
SHAPES=scripts/small_ws2.csv LIMIT=$((200 - SECONDS)) TRIALS=24 SAMPLED=16 bash bench/device.sh tune-graph
# Here (CPU): the candidate tables
python -m autotaxer export --db sqlite:///ws2.db --out candidate_nvidia-h200_ws2.json
python -m autotaxer export --db sqlite:///ws2_graph.db --out candidate_nvidia-h200_ws2_graph.json
