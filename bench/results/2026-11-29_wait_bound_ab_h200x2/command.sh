# 2026-11-29 (twentieth session), nvidia-h200-x2 (2x H200), each call over the working tree; scripts in raw.tar.xz
# (scripts/), logs in logs/, rows, bench JSON and the two new tuning databases in data/.
# devrun/state/ws2_graph.db and ws2.db: data/retune_ws2_graph.db and data/retune_ws2.db of
# bench/results/2026-11-29_ws2_back_to_back_retuned_h200x2/raw.tar.xz (the variants' tuned configurations).

# call 1 (358 s, main at c867bee): the A/B, 50 us / 10 ms / 10 ms / 50 us, bench/shapes/wait_bound_ab.csv
KEEP="bound_ab_50us_1.json.rows.jsonl bound_ab_10ms_1.json.rows.jsonl bound_ab_10ms_2.json.rows.jsonl bound_ab_50us_2.json.rows.jsonl bound_ab_graph.log bound_ab_eager.log" \
WS=2 STATE=devrun/state BENCH_LIMIT=135 bash bench/device.sh bound-ab pack      # carry .whl devrun

# kernels/common/watch.py: check_after_ns() defaults to 10 ms; then, on CPU
python -m autotaxer.tools.restamp --base c867bee --write --accept-changed "bench/results/2026-11-29_wait_bound_ab_h200x2: ..."

# call 2 (350 s): the keys whose confirmations the 50 us reads had stalled, tuned again in fresh databases
CALL=2 BUDGET=470 PLAN="e_re:600:devrun/re_eager.csv:eager:rt_ws2.db: g_re:600:devrun/re_graph.csv:graph:rt_ws2_graph.db:" \
  bash devrun/call.sh                                                          # carry .whl
python -m autotaxer export --db sqlite:///rt_ws2.db --gpu nvidia-h200 --world-size 2 --timing eager --out re_eager.json
python -m autotaxer export --db sqlite:///rt_ws2_graph.db --gpu nvidia-h200 --world-size 2 --timing graph --out re_graph.json
python -m autotaxer merge tuning_db/nvidia-h200_ws2.json re_eager.json --all --out tuning_db/nvidia-h200_ws2.json
python -m autotaxer merge tuning_db/nvidia-h200_ws2_graph.json re_graph.json --all --out tuning_db/nvidia-h200_ws2_graph.json

# call 3 (258 s): tests/runtime/test_peer_wait_gpu.py; autotaxer bench of the 13 re-tuned keys and the 9 LLM keys
# M >= 4096, each table with its own timing (devrun/call3.sh: --max-configs 1 --no-peers)
BUDGET=525 bash devrun/call3.sh                                                # carry .whl devrun/state

# call 4 (476 s): autotaxer bench of the TP2 layer's 40 keys, shipped graph table, variants at the configurations
# of bench/results/2026-11-28_ws2_finish_h200x2/raw.tar.xz ws2_graph.db
LIM=520 bash devrun/call4.sh                                                   # carry .whl devrun/state/layer_ws2_graph.db

# summaries (on CPU): scripts/summarize.py MODE OUT ROWS (per timing), scripts/summarize_bench.py ROWS OUT (graph)
