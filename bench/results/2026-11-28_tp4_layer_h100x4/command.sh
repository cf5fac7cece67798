# The four device calls of this run, from the repository root on nvidia-h100-x4 (4× H100 80GB HBM3),
# carry .whl and the scripts folder (in raw.tar.xz: scripts/callA.sh ... callD.sh, scripts/ws4_keys.csv).
# A: every GPU test file at TP2 on GPUs 0,1 beside the TP2 training layer on GPUs 2,3
(CUDA_VISIBLE_DEVICES=0,1 WS=2 TEST_LIMIT=500 bash bench/device.sh par-tests) &
CUDA_VISIBLE_DEVICES=2,3 torchrun --master-port 29611 --nproc-per-node 2 bench/layer.py --no-shipped --reps 10 \
  --db sqlite:///$OUT/train4096.sqlite --out $OUT/train4096.json --cases train:4096 \
  --modes plain_compile,autotaxer_compile,functions_compile,ceiling --warmup-budget 60
#   (then the same with --cases train:8192, --master-port 29612)
# B: per op at ws4, then the TP4 layer forward (10 reps)
python3 -P -m autotaxer bench --world-size 4 --shapes scripts/ws4_keys.csv --no-peers --no-dispatch \
  --variants torch_fused,copy_engine,ce_fanout,push,push_tma --max-configs 3 --samples 7 \
  --db sqlite:///$OUT/bench.sqlite --out $OUT/bench_ws4.json
torchrun --nproc-per-node 4 bench/layer.py --no-shipped --reps 10 --db sqlite:///$OUT/fwd.sqlite --out $OUT/fwd_tp4.json \
  --cases fwd:1024,fwd:4096 --modes plain_compile,autotaxer_compile,functions_compile,async_tp,ceiling --warmup-budget 45
# C: the TP4 forward again with 30 reps and the eager modes, then training
torchrun --nproc-per-node 4 bench/layer.py --no-shipped --reps 30 --db sqlite:///$OUT/fwd.sqlite --out $OUT/fwd_tp4_r30.json \
  --cases fwd:1024,fwd:4096 --modes plain_eager,plain_compile,autotaxer_eager,autotaxer_compile,functions_compile,async_tp,ceiling \
  --warmup-budget 45
torchrun --nproc-per-node 4 bench/layer.py --no-shipped --reps 15 --db sqlite:///$OUT/train.sqlite --out $OUT/train_tp4.json \
  --cases train:4096 --modes plain_compile,autotaxer_compile,functions_compile,ceiling --warmup-budget 60
# D: the TP4 forward in CUDA graphs
torchrun --nproc-per-node 4 bench/layer.py --no-shipped --reps 20 --db sqlite:///$OUT/graph.sqlite --out $OUT/graph_tp4.json \
  --cases graph:1024,graph:4096 --modes plain_compile,autotaxer_compile,functions_compile,ceiling --warmup-budget 40
