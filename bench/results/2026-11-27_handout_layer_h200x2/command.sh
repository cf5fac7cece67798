# The four device calls of this run (scripts in raw.tar.xz: tests_par.sh, call2.sh, call3.sh, call4.sh), from
# the repository root on nvidia-h100-x2 (2×H200 came), carry .whl, after `source bench/device.sh`.
# 1 (main 473734c): GPU tests as parallel pytest processes on the same two GPUs (correctness only; since
# then `bash bench/device.sh par-tests` runs every GPU test file this way)
GROUPS_SPEC="ev_bf16|tests/ops/test_ag_gemm_gpu.py|every_variant and bf16;ev_fp16|tests/ops/test_ag_gemm_gpu.py|every_variant and fp16;if_bf16|tests/ops/test_ag_gemm_gpu.py|iris_fused and bf16;if_fp16|tests/ops/test_ag_gemm_gpu.py|iris_fused and fp16;misc|tests/ops/test_ag_gemm_gpu.py|ce_persistent or launch_cache or tma_variant;integ|tests/runtime/test_integration_gpu.py|;gemmrs|tests/ops/test_gemm_rs_gpu.py|;async|tests/test_async_tp_gpu.py|" \
  bash devrun/tests_par.sh
# 2 (the hand-out change): its GPU tests the same way, then the TP2 training layer
GROUPS_SPEC="ce0|tests/ops/test_copy_engine_gpu.py|reference and 0;ce1|tests/ops/test_copy_engine_gpu.py|reference and 1;integ|tests/runtime/test_integration_gpu.py|;disp|tests/runtime/test_dispatch_gpu.py|;replay|tests/runtime/test_replay_gpu.py|;warm|tests/tuner/test_warmup_gpu.py|" \
  bash devrun/tests_par.sh
WS=2 CASES=train:4096 MODES=plain_compile,autotaxer_compile,functions_compile,ceiling LIMIT=300 BUDGET=50 bash bench/device.sh layer
# 3: graph cases with the check as graph replays, then as eager steps; then train:8192
M=plain_compile,autotaxer_compile,functions_compile
torchrun --nproc-per-node 2 bench/layer.py --no-shipped --reps 10 --db sqlite:///$OUT/graphs_checked.sqlite \
  --out $OUT/graphs_checked.json --cases graph:256,graph:1024 --modes $M --warmup-budget 50 --check-graphs
torchrun --nproc-per-node 2 bench/layer.py --no-shipped --reps 10 --db sqlite:///$OUT/graphs_eager_check.sqlite \
  --out $OUT/graphs_eager_check.json --cases graph:256,graph:1024 --modes $M --warmup-budget 50
torchrun --nproc-per-node 2 bench/layer.py --no-shipped --reps 10 --db sqlite:///$OUT/train8192.sqlite \
  --out $OUT/train8192.json --cases train:8192 --modes $M,ceiling --warmup-budget 60
# 4: graph:1024 with --check-graphs again (PYTHONFAULTHANDLER=1), then fwd:4096
torchrun --nproc-per-node 2 bench/layer.py --no-shipped --reps 10 --db sqlite:///$OUT/g1024_checked.sqlite \
  --out $OUT/g1024_checked.json --cases graph:1024 --modes plain_compile,autotaxer_compile --warmup-budget 50 --check-graphs
torchrun --nproc-per-node 2 bench/layer.py --no-shipped --reps 10 --db sqlite:///$OUT/fwd4096.sqlite \
  --out $OUT/fwd4096.json --cases fwd:4096 --modes $M --warmup-budget 50
