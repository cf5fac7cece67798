# Two calls on nvidia-h200 (one H200), 2026-11-28, from the repository root (main at d11789d + this
# session's ce_persistent poll modes and bench/rank0_view.py), carrying .whl.
source bench/device.sh
export CUDA_DEVICE_MAX_CONNECTIONS=32
# Call 1 (before the gate existed: each rank's part launched as the host enqueued it)
timeout -k 10 520 python3 -P bench/rank0_view.py --world-size 4 \
    --shapes 1024x2560x8192:nk,4096x2560x8192:nk,1024x14336x8192:nk --polls atomic,load,sleep --delay-us 0,100 \
    --configs 2 --calls 15 --json-out $OUT/rank0_ws4.json > $OUT/rank0_ws4.log 2>&1
# Call 2 (a 3 ms gate, fresh inputs a call)
timeout -k 10 430 python3 -P bench/rank0_view.py --world-size 4 --shapes 1024x2560x8192:nk,4096x2560x8192:nk \
    --polls atomic,load --delay-us 0,100 --configs 1 --calls 10 --gate-us 3000 \
    --json-out $OUT/rank0_ws4_gated.json > $OUT/rank0_ws4_gated.log 2>&1
