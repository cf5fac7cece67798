# The five device calls of this run, as the steps they ran (each call's exact script: command1.sh ...
# command5.sh in raw.tar.xz). From the repository root on nvidia-h200-x4, after `source bench/device.sh`;
# the GPU tests ran beside the layer on GPUs 2,3 (CUDA_VISIBLE_DEVICES=2,3, each file under `timeout`).
# 1: host time (GPUs 0,1), then the GPU tests of the moved code (issue 50)
CUDA_VISIBLE_DEVICES=0,1 torchrun --nproc-per-node 2 bench/host_probe.py --json-out $OUT/host_probe.json
# 2: run A, the TP2 layer forward and training
CUDA_VISIBLE_DEVICES=0,1 torchrun --nproc-per-node 2 bench/layer.py --cases fwd:4096,train:4096 \
  --modes plain_compile,autotaxer_compile,functions_compile,ceiling --no-shipped --warmup-budget 45 \
  --db sqlite:///$OUT/layer.sqlite --reps 10 --out $OUT/layer.json
# 3: run B, with PyTorch's async TP (then, on any machine: bench/calls.py agreement over its files)
CUDA_VISIBLE_DEVICES=0,1 torchrun --nproc-per-node 2 bench/layer.py --cases fwd:4096,graph:1024 \
  --modes plain_compile,autotaxer_compile,functions_compile,async_tp,async_tp_autotaxer,ceiling --no-shipped \
  --warmup-budget 40 --db sqlite:///$OUT/layer.sqlite --reps 10 --out $OUT/layer.json
python3 -P bench/calls.py agreement --layer layer_run_b.json --db sqlite:///layer_run_b.sqlite --out agreement_run_b.json
# 4: test_replay_gpu on GPUs 0,1, then the TP4 layer (the modes of run B)
torchrun --nproc-per-node 4 bench/layer.py --cases fwd:4096,graph:1024 \
  --modes plain_compile,autotaxer_compile,functions_compile,async_tp,async_tp_autotaxer,ceiling --no-shipped \
  --warmup-budget 40 --db sqlite:///$OUT/layer_ws4.sqlite --reps 10 --out $OUT/layer_ws4.json
# 5: host time at 4 ranks
torchrun --nproc-per-node 4 bench/host_probe.py --json-out $OUT/host_probe_ws4.json
