# nvidia-h200 (one H200), 2026-11-29, from the repository root, carrying .whl; after `source bench/device.sh`.
export CUDA_DEVICE_MAX_CONNECTIONS=32
# Call 1, the profile (main at 020b3a8, `once` the default): one gated call under torch.profiler
python3 -P rank0_prof.py 1024 2560 triton > profile_once_triton.log   # rank0_prof.py is in raw.tar.xz
python3 -P rank0_prof.py 1024 2560 memop > profile_once_memop.log
# Call 2, the threshold as an experiment (an environment variable then, since replaced by `late`)
for after in 50 10000; do
AUTOTAXER_CE_PERSISTENT_CHECK_AFTER_US=$after python3 -P bench/rank0_view.py --world-size 4 --shapes 1024x2560x8192:nk \
  --polls load --delay-us 0,100 --configs 2 --signals triton,memop --calls 10 > env_check_after_$after.log
done
AUTOTAXER_CE_PERSISTENT_CHECK_AFTER_US=10000 python3 -P bench/rank0_view.py --world-size 4 \
  --shapes 4096x2560x8192:nk,1024x14336x8192:nk --polls load --delay-us 0 --configs 2 --signals triton,memop --calls 8
# Call 3, the committed `late` against `once`, and the emulated GPU tests
timeout 170 python3 -P -m pytest -q -x -p no:cacheprovider -m "gpu or emulated" tests/ops/test_emulated_ranks_gpu.py \
  -k "copy_engine_family and ce_persistent" -rs > emulated_gpu.log
for reads in once late; do
AUTOTAXER_CE_PERSISTENT_BOUND_READS=$reads python3 -P bench/rank0_view.py --world-size 4 --shapes 1024x2560x8192:nk \
  --polls atomic,load --delay-us 0 --configs 2 --signals triton,memop --calls 10 > reads_${reads}_m1024.log
done
timeout 100 python3 -P bench/rank0_view.py --world-size 4 --shapes 4096x2560x8192:nk,1024x14336x8192:nk \
  --polls load --delay-us 0 --configs 2 --signals triton,memop --calls 6 > reads_late_big.log
