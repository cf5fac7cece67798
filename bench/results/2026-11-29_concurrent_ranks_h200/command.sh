set -u
export PYTHONFAULTHANDLER=1 CUDA_DEVICE_MAX_CONNECTIONS=32
source bench/device.sh || exit 1
for after in default 10000; do
  t0=$SECONDS
  if [ $after = default ]; then unset AUTOTAXER_WAIT_CHECK_AFTER_US; else export AUTOTAXER_WAIT_CHECK_AFTER_US=$after; fi
  timeout -k 10 265 python3 -P bench/concurrent_ranks.py --world-size 4 --variants push_tma,push \
    --shapes 1024x2560x8192:nk,4096x2560x8192:nk --configs 1 --calls 15 --json-out $OUT/concurrent_$after.json > $OUT/concurrent_$after.log 2>&1
  echo "after=$after rc=$? $((SECONDS-t0))s"; grep -v "^\s*$" $OUT/concurrent_$after.log | tail -8
done
unset AUTOTAXER_WAIT_CHECK_AFTER_US
