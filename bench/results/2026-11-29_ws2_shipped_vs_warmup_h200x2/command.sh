# 2026-11-29, nvidia-h200-x2 (2x H200), each call over the working tree with `carry [".whl", ...]`; the
# scripts are in raw.tar.xz (scripts/call*.sh). Call 5 was `WS=2 bash bench/device.sh copy-sm`
# (bench/results/2026-11-29_copy_sm_peers_h200x2/).
bash devrun/call1.sh   # the layer with the shipped tables, every column: graph cases --timing graph, eager cases as shipped
bash devrun/call2.sh   # the same cases' layer with a 180 s warm-up in the launch and no shipped table (graph:4096, train:4096)
bash devrun/call3.sh   # shipped vs NO table (the warm-up database was not carried: .sqlite is git-ignored), graph:1024 warm-up
bash devrun/call4.sh   # shipped vs call 2's warm-up database, interleaved twice; bench of the 23 re-stamped keys
bash devrun/call6.sh   # the async TP fix: async_tp against async_tp_autotaxer with the merged table, per-call replay
# on a CPU machine afterwards:
python3 scripts/summarize_layer.py <layer JSON files> > layer_summary.json
python3 scripts/summarize_bench.py bench_ws2.json.rows.jsonl bench_restamped_summary.json
python -m autotaxer export --db sqlite:///warm_eager.sqlite --gpu nvidia-h200 --world-size 2 --out new_ws2_warm.json
python -m autotaxer merge tuning_db/nvidia-h200_ws2.json new_ws2_warm.json --all --out tuning_db/nvidia-h200_ws2.json
