#!/usr/bin/env bash
set -u
# .devrun/bsp_old.py = `git show 75235e8:autotaxer/ops/gemm_rs/bsp.py` (before the fix)
source bench/device_env.sh || exit 1
new_pkg=${PYTHONPATH%%:*}; deps=${PYTHONPATH#*:}
old=$(mktemp -d /tmp/old.XXXX); cp -r "$new_pkg"/. "$old"/; cp .devrun/bsp_old.py "$old/autotaxer/ops/gemm_rs/bsp.py"
for v in old new old new; do
  if [ $v = old ]; then p=$old; else p=$new_pkg; fi
  PYTHONPATH="$p:$deps" timeout 150 torchrun --nproc-per-node 2 bench/layer.py --cases train:4096,fwd:256 --modes plain_eager,autotaxer_eager --reps 12 --out $OUT/layer_$v.$RANDOM.json 2>&1 | grep -E "^(plain|autotaxer)" | sed "s/^/$v /"
done
