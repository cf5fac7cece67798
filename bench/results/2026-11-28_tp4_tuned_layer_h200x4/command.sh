# Device calls on the nvidia-h100-x4 kind (4x H200 came), from the repository root, carrying .whl and the
# scripts folder (raw.tar.xz: scripts/call1.sh ... call6.sh, the shapes files, ce_pull_check.py); each call's
# output in raw.tar.xz: callN/.
# Call 1: ce_pull's reference check on 4 GPUs, then per op over the layer's 16 ag_gemm keys (seeds only)
export WS=4
source bench/device.sh
python3 -P scripts/ce_pull_check.py 4
python3 -P -m autotaxer bench --world-size 4 --shapes scripts/ag_ws4.csv --no-peers --no-dispatch \
  --variants torch_fused,copy_engine,ce_fanout,ce_pull --max-configs 3 --samples 7 \
  --db sqlite:///$OUT/bench.sqlite --out $OUT/bench_ag_ws4.json
# Call 2: graph-timed tune of the forward keys at M 1024/4096/8192, then the layer's graph cases on it
for op in ag_gemm gemm_rs; do
  v=torch_fused,copy_engine; [ $op = ag_gemm ] && v=$v,ce_fanout,ce_pull
  python3 -P -m autotaxer tune --world-size 4 --shapes scripts/fwd_ws4.csv --op $op --variants $v --trials 16 \
    --sampled 8 --db sqlite:///$OUT/ws4_graph.db --jsonl --trial-timeout 60 --seed 0 --timing graph
done
torchrun --nproc-per-node 4 bench/layer.py --cases graph:4096,graph:1024 --modes plain_compile,autotaxer_compile,ceiling \
  --no-shipped --warmup-budget 70 --check-graphs --db sqlite:///$OUT/ws4_graph.db --reps 20 --out $OUT/layer_graph.json
# Call 3: the same tune in eager timing over M=1024 nk and M=4096 (both layouts) -> ws4.db, then
torchrun --nproc-per-node 4 bench/layer.py --cases fwd:4096,train:4096,fwd:1024 --modes plain_compile,autotaxer_compile,ceiling \
  --no-shipped --warmup-budget 60 --db sqlite:///$OUT/ws4.db --reps 20 --out $OUT/layer_eager.json
# Call 4: the GPU tests of the tuner's sample sizing; the graph tune of the M=16384 keys into call 2's database;
python3 -P -m pytest -q -m gpu tests/tuner/test_measure.py
python3 -P -m autotaxer bench --world-size 4 --shapes scripts/fwd_all_ws4.csv --device cuda --db sqlite:///$OUT/ws4_graph.db \
  --dispatch-timing graph --variants torch_fused,copy_engine,ce_fanout,ce_pull --max-configs 3 --iters 10 --samples 7 \
  --peer-timeout 30 --no-peers --out $OUT/bench_dispatch_ws4.json
# (its layer run of graph:8192,graph:16384 stopped with an illegal address: torch's workspace, fixed in 773dbf3)
# Call 5 (773dbf3): the torch_fused GPU tests, then the large graph cases on call 4's database
python3 -P -m pytest -q tests/ops/test_torch_fused_gpu.py
torchrun --nproc-per-node 4 bench/layer.py --cases graph:8192,graph:16384 --modes plain_compile,autotaxer_compile,ceiling \
  --no-shipped --warmup-budget 60 --check-graphs --db sqlite:///$OUT/ws4_graph.db --reps 15 --out $OUT/layer_graph_big.json
# Call 6 (four short runs on call 5's database, looking for the exit hang): graph:1024; graph:4096 (1.14x again);
# graph:4096,graph:1024 with the ceiling; --reps 5 --warmup-budget 30 --check-graphs
