#!/usr/bin/env bash
# 2026-11-29, nvidia-h200 (one H200), each line a device call's step (source bench/device.sh first).
export CUDA_DEVICE_MAX_CONNECTIONS=32
# call 1: the refactor's GPU test (run as python3 -m pytest it could not import autotaxer.kernels: use -P),
# the first host-source version (peers' rows at once), push_tma's bound-read A/B
python3 -P bench/rank0_view.py --world-size 4 --source host_together --shapes 4096x14336x8192:nk,1024x14336x8192:nk,4096x2560x8192:nk --polls load --delay-us 0 --configs 1 --signals memop --calls 10
python3 -P bench/concurrent_ranks.py --world-size 4 --variants push_tma --shapes 1024x2560x8192:nk --configs 1 --calls 15
AUTOTAXER_WAIT_CHECK_AFTER_US=10000 python3 -P bench/concurrent_ranks.py --world-size 4 --variants push_tma --shapes 1024x2560x8192:nk --configs 1 --calls 15
# call 2: in arrival order (stand-in waits were torch.cuda._sleep then), both flag back ends; the GPU test
python3 -P bench/rank0_view.py --world-size 4 --source host --shapes 4096x14336x8192:nk,1024x14336x8192:nk,4096x2560x8192:nk,1024x2560x8192:nk --polls load --delay-us 0 --configs 1 --signals memop --calls 10
python3 -P bench/rank0_view.py --world-size 4 --source host --shapes 4096x14336x8192:nk,1024x14336x8192:nk --polls load --delay-us 0 --configs 1 --signals triton --calls 10
python3 -P -m pytest -q -m gpu tests/runtime/test_peer_wait_gpu.py -p no:cacheprovider
# call 3: when each chunk lands, both orders
for src in host host_together; do
  python3 -P bench/rank0_view.py --world-size 4 --source $src --shapes 4096x14336x8192:nk --polls load --delay-us 0 --configs 1 --signals memop --calls 10
done
# call 4: stand-in waits on the ns timer; tile groups inside a chunk
R="python3 -P bench/rank0_view.py --world-size 4 --source host --polls load --delay-us 0 --configs 1 --signals memop --calls 10"
$R --shapes 4096x14336x8192:nk
$R --shapes 4096x14336x8192:nk --set group_m=2
$R --shapes 1024x14336x8192:nk --set group_m=1
# call 5: the same at a key whose copies outlast the GEMM
$R --shapes 4096x2560x8192:nk
$R --shapes 4096x2560x8192:nk --set group_m=2
# call 6: order 1 (chunk-major sends and tiles) with every peer's rows at once
R="python3 -P bench/rank0_view.py --world-size 4 --source host_together --polls load --delay-us 0 --configs 1 --signals memop --calls 10 --shapes 4096x2560x8192:nk"
$R --set group_m=2
$R --set group_m=2,order=1
