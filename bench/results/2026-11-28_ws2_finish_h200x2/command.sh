# Device calls on nvidia-h200-x2 (2x H200), 2026-11-28 (eleventh session), from the repository root (main at
# 026f3a4 + this session's work), carrying .whl and devrun/ (the scripts and shapes files, devrun/state/ws2.db
# from 2026-11-28_ws2_ship_h200x2/raw.tar.xz and ws2_graph.db from 2026-11-28_ws2_tables_h200x2/raw.tar.xz).
# The full scripts: scripts/call1.sh ... call5.sh in raw.tar.xz. Between calls the returned databases were put
# back under devrun/state/ (copy a database with its -wal file, or checkpoint it first: call 2's graph:4096
# verdicts were lost without it).
export WS=2 STATE=devrun/state
source bench/device.sh
# Call 1: ce_persistent's GPU tests at ws2 (issue 47), the peer crash reproduced, the graph re-tune of gemm_rs
python3 -P -m pytest -q -p no:cacheprovider -rs tests/ops/test_ag_gemm_gpu.py -k "ce_persistent and two"
CUDA_LAUNCH_BLOCKING=1 python3 -P -m autotaxer bench --world-size 2 --shapes scripts/peer_row.csv --device cuda \
    --variants torch_fused --no-dispatch --peers --max-configs 1 --iters 10 --samples 5   # and copy_engine
python3 -P -m autotaxer tune --world-size 2 --shapes scripts/rs_large_ws2.csv --trials 24 --sampled 16 \
    --db sqlite:///devrun/state/ws2_graph.db --jsonl --trial-timeout 60 --seed 0 --timing graph --retune
# Call 2: the same for ag_gemm's small-N keys at M >= 8192, then the graph table in the step
python3 -P -m autotaxer tune --world-size 2 --shapes scripts/ag_large_ws2.csv --trials 24 --sampled 16 \
    --db sqlite:///devrun/state/ws2_graph.db --jsonl --trial-timeout 60 --seed 0 --timing graph --retune
CASES=graph:4096,graph:8192,graph:16384 BUDGET=60 bash bench/device.sh layer-check-graph
# Call 3: the graph checks again with a Python stack on the crash; the eager table at S=8192
PYTHONFAULTHANDLER=1 CASES=graph:8192 BUDGET=60 bash bench/device.sh layer-check-graph   # and graph:16384
CASES=train:8192 BUDGET=70 bash bench/device.sh layer-check
# Call 4: the peers with a back-to-back chain; the graph checks with the capture fix; train:16384; export; bench
python3 -P -m autotaxer bench --world-size 2 --shapes scripts/peer_row.csv --device cuda --variants copy_engine \
    --no-dispatch --peers --max-configs 1 --iters 10 --samples 5 --chain back-to-back
CASES=graph:8192,graph:16384 BUDGET=60 bash bench/device.sh layer-check-graph
CASES=train:16384 BUDGET=70 bash bench/device.sh layer-check
python3 -P -m autotaxer export --db sqlite:///devrun/state/ws2_graph.db --gpu nvidia-h200 --world-size 2 --out new.json
python3 -P -m autotaxer merge tuning_db/nvidia-h200_ws2_graph.json new.json --all --out nvidia-h200_ws2_graph.json  # and eager
SHAPES=scripts/big_ws2.csv bash bench/device.sh bench
# Call 5: the peers with the chain fix; the replay GPU tests; the merged graph table served; the check without replays
python3 -P -m autotaxer bench --world-size 2 --shapes scripts/peer_row.csv --device cuda \
    --variants torch_fused,copy_engine --no-dispatch --peers --max-configs 1 --iters 10 --samples 5
python3 -P -m pytest -q -p no:cacheprovider -rs -m gpu tests/runtime/test_replay_gpu.py tests/ops/test_torch_fused_gpu.py
torchrun --nproc-per-node 2 bench/layer.py --cases graph:8192,graph:16384 --modes plain_compile,autotaxer_compile \
    --no-shipped --tables nvidia-h200_ws2_graph.json --db sqlite:////tmp/layer_served.db --reps 5
AUTOTAXER_REPLAY=0 torchrun --nproc-per-node 2 bench/layer.py --cases graph:16384 \
    --modes plain_compile,autotaxer_compile --no-shipped --warmup-budget 60 --db sqlite:////tmp/diag.db --reps 5 --check-graphs
# Call 6: graph:4096/8192 checked again on call 4's returned database (hung at graph:4096's third key); only the
# two records it checked were merged, on this machine:
CASES=graph:4096,graph:8192 BUDGET=60 LIMIT=120 bash bench/device.sh layer-check-graph
python3 -m autotaxer merge tuning_db/nvidia-h200_ws2_graph.json graph4096_checked.json --all --out tuning_db/nvidia-h200_ws2_graph.json
