# 2026-11-29 (nineteenth session), nvidia-h200-x2 (2x H200), each call over the working tree; the scripts are in
# raw.tar.xz (scripts/). devrun/ws2.db started as the eighteenth session's data/llm_retune_ws2_partial.db
# (bench/results/2026-11-29_ws2_redecided_h200x2/raw.tar.xz), carried and returned by every call.
# large.csv / small.csv: bench/shapes/ws2_back_to_back.csv split at M = 4096.
CALL=1 BUDGET=515 PLAN="e_large:60:devrun/large.csv:eager:ws2.db:torch_fused,copy_engine \
  g_large:150:devrun/large.csv:graph:ws2_graph.db:torch_fused,copy_engine g_small:600:devrun/small.csv:graph:ws2_graph.db:" \
  bash devrun/call.sh                     # carry .whl devrun/ws2.db
CALL=2 BUDGET=540 PLAN="g_small:600:devrun/small.csv:graph:ws2_graph.db: e_small:600:devrun/small.csv:eager:ws2.db:" \
  bash devrun/call.sh                     # carry .whl devrun/ws2.db devrun/ws2_graph.db
CALL=3 BUDGET=505 PLAN="e_small:600:devrun/small.csv:eager:ws2.db:" bash devrun/call.sh
bash devrun/bench.sh                      # autotaxer bench, the 12 keys M <= 64, graph table (ws2_graph.db)
bash devrun/bench2.sh                     # the 16 keys M = 128 ... 2048 with the graph table; the 28 keys M < 4096 with the eager table
# on CPU afterwards
python -m autotaxer export --db sqlite:///devrun/ws2.db --gpu nvidia-h200 --world-size 2 --timing eager --out re_eager.json
python -m autotaxer export --db sqlite:///devrun/ws2_graph.db --gpu nvidia-h200 --world-size 2 --timing graph --out re_graph.json
# re37_*.json: those records of the 37 keys of bench/shapes/ws2_back_to_back.csv (the two nk keys the eighteenth
# session's partial run tuned are left out: one was interrupted at 6 trials, the shipped table has both)
python -m autotaxer merge tuning_db/nvidia-h200_ws2.json re37_ws2.json --all --out tuning_db/nvidia-h200_ws2.json
python -m autotaxer merge tuning_db/nvidia-h200_ws2_graph.json re37_ws2_graph.json --all --out tuning_db/nvidia-h200_ws2_graph.json
python scripts/summarize.py graph bench_small_graph_summary.json data/bench_small_graph.json.rows.jsonl data/bench_small2_graph.json.rows.jsonl
python scripts/summarize.py eager bench_small_eager_summary.json data/bench_small_eager.json.rows.jsonl
