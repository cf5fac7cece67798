# 2026-11-30, nvidia-h200-x2 (2x H200), four device calls over the working tree (main at 96ba6a8; call 4 with the
# workspace fix of autotaxer/ops/_torch_symm.py), each with `carry [".whl", ...]`; the scripts are in
# raw.tar.xz (scripts/call*.sh, scripts/lc.csv).
bash devrun/call1.sh   # the layer with the shipped tables, every column: graph cases --timing graph (20 reps), fwd/train:4096 (10 reps)
bash devrun/call2.sh   # no shipped table, a 180 s warm-up in the launch: graph:1024 (crashed after the warm-up), train:4096
bash devrun/call3.sh   # shipped against call 2's warm-up databases, twice interleaved (graph:1024; fwd,train:4096); autotaxer bench of 2 keys (eager)
bash devrun/call4.sh   # with the fix: fwd,train:4096 warm-up database against shipped, twice; tests/ops/test_torch_fused_gpu.py; graph:1024 warm-up again
bash devrun/call5.sh   # autotaxer tune --timing graph of ag_gemm 256x14336x8192 kn (devrun/k256.csv), exported
# on a CPU machine afterwards:
python -m autotaxer merge tuning_db/nvidia-h200_ws2_graph.json call5/k256.json --out tuning_db/nvidia-h200_ws2_graph.json
python3 scripts/summarize_layer.py call1/*.json call2/*.json call3/g_*.json call3/e_shipped*.json call4/e_*.json call4/g_warmup.json > layer_summary.json
python -m autotaxer report <2026-11-29_wait_bound_ab_h200x2 raw.tar.xz: data/layer40.json> --out report/   # 3 of its plots kept
