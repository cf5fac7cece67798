# nvidia-h200 (one H200), 2026-11-29, from the repository root, carrying .whl.
source bench/device.sh
# the probe (final form; two earlier forms in devrun/ gave the same verdicts)
python3 -P bench/copy_sm_probe.py --json-out $OUT/copy_sm_probe.json
# the gated rank0_view call (8 ms gate) that found the stall on one GPU
export CUDA_DEVICE_MAX_CONNECTIONS=32
timeout -k 10 200 python3 -P bench/rank0_view.py --world-size 4 --shapes 1024x2560x8192:nk,1024x14336x8192:nk \
  --polls atomic,load,sleep --delay-us 0,100 --configs 1 --signals triton,memop --calls 10 \
  --json-out $OUT/rank0_gated_m1024.json > $OUT/rank0_gated_m1024.log 2>&1
timeout -k 10 170 python3 -P bench/rank0_view.py --world-size 4 --shapes 4096x2560x8192:nk \
  --polls atomic,load --delay-us 0,100 --configs 1 --signals memop --calls 8 \
  --json-out $OUT/rank0_gated_m4096.json > $OUT/rank0_gated_m4096.log 2>&1
