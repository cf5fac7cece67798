source bench/device.sh
export TRITON_CACHE_DIR=/tmp/tc HOME=/tmp/hP; mkdir -p $HOME
t0=$SECONDS
CUDA_VISIBLE_DEVICES=0,1 timeout 70 python3 -P -m pytest -q -x -p no:cacheprovider -rs tests/runtime/test_replay_gpu.py > $OUT/t_replay.log 2>&1
echo "test_replay_gpu rc=$? $((SECONDS-t0))s $(tail -n1 $OUT/t_replay.log)" >> $OUT/tests.txt
t0=$SECONDS
timeout -s INT -k 20 370 torchrun --nproc-per-node 4 bench/layer.py --cases fwd:4096,graph:1024 \
  --modes plain_compile,autotaxer_compile,functions_compile,async_tp,async_tp_autotaxer,ceiling --no-shipped --warmup-budget 40 \
  --db sqlite:///$OUT/layer_ws4.sqlite --reps 10 --out $OUT/layer_ws4.json > $OUT/layer_ws4.log 2>&1
echo "layer_ws4 rc=$? $((SECONDS-t0))s" >> $OUT/tests.txt
python3 -c "import sqlite3; c=sqlite3.connect('$OUT/layer_ws4.sqlite'); c.execute('PRAGMA wal_checkpoint(TRUNCATE)'); c.execute('PRAGMA journal_mode=DELETE'); c.close()"
gzip $OUT/layer_ws4.log
zcat $OUT/layer_ws4.log.gz | grep -v "^W1127\|INFO\|^\*\*\*" | grep -A200 "^ms (x" | head -60
grep -E "^E " $OUT/t_replay.log | head -5
cat $OUT/tests.txt
