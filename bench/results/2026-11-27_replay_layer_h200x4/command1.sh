source bench/device.sh
export TRITON_CACHE_DIR=/tmp/tc
bg() {  # GPUs 2,3: the GPU tests of the moved code (issue 50)
  export CUDA_VISIBLE_DEVICES=2,3 HOME=/tmp/hA; mkdir -p $HOME
  for spec in "280 tests/runtime/test_integration_gpu.py" "110 tests/test_async_tp_gpu.py" "130 tests/tuner/test_warmup_gpu.py"; do
    set -- $spec; t0=$SECONDS
    timeout $1 python3 -P -m pytest -q -x -p no:cacheprovider -rs $2 > $OUT/t_$(basename $2 .py).log 2>&1
    echo "$2 rc=$? $((SECONDS-t0))s $(tail -n1 $OUT/t_$(basename $2 .py).log)" >> $OUT/tests.txt
  done
}
bg &
export CUDA_VISIBLE_DEVICES=0,1 HOME=/tmp/hP; mkdir -p $HOME
t0=$SECONDS; timeout 200 torchrun --nproc-per-node 2 bench/host_probe.py --json-out $OUT/host_probe.json > $OUT/host_probe.log 2>&1; echo "probe rc=$? $((SECONDS-t0))s" >> $OUT/tests.txt
for spec in "120 tests/runtime/test_dispatch_gpu.py" "120 tests/ops/test_copy_engine_gpu.py" "120 tests/ops/test_gemm_rs_gpu.py" "100 tests/tuner/test_measure.py" "80 tests/runtime/test_peer_wait_gpu.py" "100 tests/ops/test_ag_gemm_gpu.py"; do
  set -- $spec; t0=$SECONDS
  [ $SECONDS -gt 480 ] && break
  timeout $1 python3 -P -m pytest -q -x -p no:cacheprovider -rs -m gpu $2 > $OUT/t_$(basename $2 .py).log 2>&1
  echo "$2 rc=$? $((SECONDS-t0))s $(tail -n1 $OUT/t_$(basename $2 .py).log)" >> $OUT/tests.txt
done
wait
tail -n 40 $OUT/host_probe.log
cat $OUT/tests.txt
