# 2026-11-29 (eighteenth session), nvidia-h200-x2 (2x H200), each call over the working tree with
# `carry [".whl", ...]`; the scripts are in raw.tar.xz (scripts/), with the shapes files they read.
python3 scripts/select.py   # on CPU: the 12 records decided before the step check's tie rule -> the tables without
                            # them (ws2*_minus.json) and their shapes (keys_mid.csv, keys_16k.csv, keys_graph_mid.csv)
bash devrun/call1.sh        # autotaxer tune of the 12 keys (torch_fused, copy_engine and the BSP forms; 11 eager, 1 graph)
bash devrun/call2.sh        # carry re_eager.db, re_graph.db: bench/layer.py's warm-up checks them in the step
                            # (graph:8192 --check-graphs; train:1024,train:8192; train:16384), every other key
                            # served from the shipped table without them (--no-shipped --tables ws2*_minus.json)
# on CPU: the verdicts into the shipped tables
python -m autotaxer export --db sqlite:///re_eager.db --gpu nvidia-h200 --world-size 2 --timing eager --out re_ws2.json
python -m autotaxer export --db sqlite:///re_graph.db --gpu nvidia-h200 --world-size 2 --timing graph --out re_ws2_graph.json
python -m autotaxer merge tuning_db/nvidia-h200_ws2.json re_ws2.json --all --out new_ws2.json
python -m autotaxer merge tuning_db/nvidia-h200_ws2_graph.json re_ws2_graph.json --all --out new_ws2_graph.json
bash devrun/call3.sh        # the layer, old tables then new, no warm-up; bench of the M=8192 keys
bash devrun/call4.sh        # carry old_ws2_graph.db (2026-11-28_ws2_finish's ws2_graph.db): bench of the 40 layer keys
ORDER="new old" ROUND=2 BENCH= TRAIN_LIMIT=170 \
  TRAIN_MODES=plain_eager,autotaxer_eager,plain_compile,autotaxer_compile,async_tp,async_tp_autotaxer bash devrun/call3.sh
                            # the layer, new tables first (BENCH= did not skip the bench: ${BENCH:-1}; it ran the
                            # M=8192 keys again without the tuning database, bench_m8192_call5_untuned_db.rows.jsonl)
bash devrun/call6.sh        # train:1024 alone, old/new/old/new
WS=2 SHAPES="examples/shapes_llm.csv examples/shapes_llm_linear.csv" SPLIT_M=4096 VARIANTS_LARGE=torch_fused,copy_engine \
  LIMIT_LARGE=80 LIMIT=110 KEEP="ws2.db gpu.txt" bash bench/device.sh tune pack
                            # the re-tune of the LLM shapes begun (10 keys; data/llm_retune_ws2_partial.db: resume it)
# on CPU afterwards:
python3 scripts/summarize_bench.py bench_ws2.json.rows.jsonl bench_layer40_summary.json
python3 scripts/paired_from_logs.py logs/call2/chk_*.log logs/call3/*_*.log logs/call5/*_*.log logs/call6/*.log > layer_paired.json
