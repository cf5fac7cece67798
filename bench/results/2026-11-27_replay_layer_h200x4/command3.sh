source bench/device.sh
export TRITON_CACHE_DIR=/tmp/tc
bg() {
  export CUDA_VISIBLE_DEVICES=2,3 HOME=/tmp/hA; mkdir -p $HOME
  for spec in "90 tests/runtime/test_replay_gpu.py" "260 tests/runtime/test_integration_gpu.py" "60 tests/ops/test_copy_engine_gpu.py" "200 tests/ops/test_ag_gemm_gpu.py"; do
    set -- $spec; t0=$SECONDS
    [ $SECONDS -gt 480 ] && break
    timeout $1 python3 -P -m pytest -q -x -p no:cacheprovider -rs $2 > $OUT/t_$(basename $2 .py).log 2>&1
    echo "$2 rc=$? $((SECONDS-t0))s $(tail -n1 $OUT/t_$(basename $2 .py).log)" >> $OUT/tests.txt
  done
}
bg &
export CUDA_VISIBLE_DEVICES=0,1 HOME=/tmp/hP; mkdir -p $HOME
t0=$SECONDS
timeout -s INT -k 20 520 torchrun --nproc-per-node 2 bench/layer.py --cases fwd:4096,graph:1024 \
  --modes plain_compile,autotaxer_compile,functions_compile,async_tp,async_tp_autotaxer,ceiling --no-shipped --warmup-budget 40 \
  --db sqlite:///$OUT/layer.sqlite --reps 10 --out $OUT/layer.json > $OUT/layer.log 2>&1
echo "layer rc=$? $((SECONDS-t0))s" >> $OUT/tests.txt
wait
python3 -c "import sqlite3; c=sqlite3.connect('$OUT/layer.sqlite'); c.execute('PRAGMA wal_checkpoint(TRUNCATE)'); c.execute('PRAGMA journal_mode=DELETE'); c.close()"
gzip $OUT/layer.log
zcat $OUT/layer.log.gz | grep -v "^W1127\|INFO\|^\*\*\*" | grep -A200 "^ms (x" | head -80
cat $OUT/tests.txt
