#!/usr/bin/env bash
# Third device call (short): why the chained-timing GPU test failed (each mode's entry and its error), and
# bench/calls.py served-vs-trial on 2 GPUs (the tuner's trial against the served call, gemm_rs M=4096 K=8192).
set -u
source bench/device.sh || exit 1
CUDA_VISIBLE_DEVICES=0 timeout 60 python3 -P - <<'PY'
import torch
from autotaxer._target import cuda_target
from autotaxer.measure import Chain, time_interleaved
from autotaxer.ops import RunContext
ctx = RunContext(rank=0, world_size=1, device=torch.device("cuda", 0), target=cuda_target(0))
a = torch.randn(1024, 1024, device="cuda", dtype=torch.bfloat16)
b = torch.randn(1024, 1024, device="cuda", dtype=torch.bfloat16)
out = torch.empty(1024, 1024, device="cuda", dtype=torch.bfloat16)
def gemm():
    torch.matmul(a, b, out=out)
    out[0, 0] = float("nan")
for mode in ("eager", "graph"):
    (t,) = time_interleaved([gemm], ctx, (mode,), warmup=2, iters=10, samples=3, chains=[Chain(a, out)])
    print(mode, t)
PY
timeout 150 python3 -P -m torch.distributed.run --nproc-per-node 2 bench/calls.py served-vs-trial --json-out $OUT/svt_rs.json > $OUT/svt.log 2>&1
echo "svt rc=$?"; grep -v "INFO  \[Iris\]\|Warning\|warn" $OUT/svt.log | tail -25
