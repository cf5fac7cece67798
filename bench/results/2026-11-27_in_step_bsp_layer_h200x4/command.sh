# The four device calls of this run (each call's exact script in raw.tar.xz: command1_and_3.sh, command2.sh,
# command4.sh), from the repository root on nvidia-h200-x4 after `source bench/device.sh`.
# 1 (commit ddda647, the check against the fastest form) and 3 (commit 2981801, bsp the reference): TP4
torchrun --nproc-per-node 4 bench/layer.py --cases fwd:4096,fwd:1024 \
  --modes plain_compile,autotaxer_compile,functions_compile,async_tp,async_tp_autotaxer,ceiling --no-shipped \
  --warmup-budget 45 --db sqlite:///$OUT/layer_ws4.sqlite --reps 10 --out $OUT/layer_ws4.json
torchrun --nproc-per-node 4 bench/layer.py --cases train:4096 \
  --modes plain_compile,autotaxer_compile,functions_compile,ceiling --no-shipped --warmup-budget 45 \
  --db sqlite:///$OUT/layer_ws4_train.sqlite --reps 10 --out $OUT/layer_ws4_train.json
python3 -P bench/calls.py agreement --layer $OUT/layer_ws4.json --db sqlite:///$OUT/layer_ws4.sqlite --out $OUT/agreement_ws4.json
# 2 (2981801): TP2 on GPUs 0,1; GPU tests on GPUs 2,3 beside it
CUDA_VISIBLE_DEVICES=0,1 torchrun --nproc-per-node 2 bench/layer.py --cases fwd:4096,train:4096,graph:1024 \
  --modes plain_compile,autotaxer_compile,functions_compile,ceiling --no-shipped --warmup-budget 40 \
  --db sqlite:///$OUT/layer_ws2.sqlite --reps 10 --out $OUT/layer_ws2.json
# 4 (2981801): TP2 under CUDA graphs with PyTorch's async TP, then the agreement table
CUDA_VISIBLE_DEVICES=0,1 torchrun --nproc-per-node 2 bench/layer.py --cases graph:256,graph:1024 \
  --modes plain_compile,autotaxer_compile,functions_compile,async_tp,async_tp_autotaxer,ceiling --no-shipped \
  --warmup-budget 40 --db sqlite:///$OUT/layer_ws2g.sqlite --reps 10 --out $OUT/layer_ws2g.json
python3 -P bench/calls.py agreement --layer $OUT/layer_ws2g.json --db sqlite:///$OUT/layer_ws2g.sqlite --out $OUT/agreement_ws2g.json
