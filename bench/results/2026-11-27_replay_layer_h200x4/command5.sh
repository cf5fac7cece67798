source bench/device.sh; export HOME=/tmp/hP TRITON_CACHE_DIR=/tmp/tc; mkdir -p $HOME; timeout 100 torchrun --nproc-per-node 4 bench/host_probe.py --json-out $OUT/host_probe_ws4.json
