#!/usr/bin/env bash
# A/B a kernel change on 2 GPUs: this working tree ("b") against a reference tree ("a", $REF, made with
# `mkdir ab_ref && git archive REV pyproject.toml README.md autotaxer kernels bench migrations tuning_db |
# tar -x -C ab_ref`; ab_ref/ is git-ignored: name it in the device call's carry, beside .whl), in one call:
#   1. the push kernel at one rank against cuBLAS (bench/gemm_vs_cublas.py --fused), a on GPU 0 and b on
#      GPU 1 at once, then swapped (cublas_{a,b}{0,1}.json: tree, GPU);
#   2. bench/config_probe.py with $PROBE on both GPUs: a, b, a again (drift check).
# Usage (device, repo root): REF=ab_ref PROBE=bench/probes/lean_bookkeeping.json M=256,512,1024 bash bench/ab_device.sh
set -u
source bench/device_env.sh || exit 1
: "${REF:?reference tree}" "${PROBE:?probe json}" "${M:=256,512,1024}" "${CUBLAS_M:=256,1024,4096}"
site_a=$(mktemp -d /tmp/ab_a.XXXX)
python3 -m pip install -q --no-deps --no-index --no-build-isolation --target "$site_a" "./$REF" || exit 1
site_b=${PYTHONPATH%%:*}
deps=${PYTHONPATH#*:}
run_a() { PYTHONPATH="$site_a:$deps" python3 -P "$REF/$1" "${@:2}"; }
run_b() { PYTHONPATH="$site_b:$deps" python3 -P "$1" "${@:2}"; }
gvc=(--fused --shapes 8192x8192 --ms "$CUBLAS_M")
CUDA_VISIBLE_DEVICES=0 run_a bench/gemm_vs_cublas.py "${gvc[@]}" --out "$OUT/cublas_a0.json" > "$OUT/cublas_a0.log" 2>&1 &
CUDA_VISIBLE_DEVICES=1 run_b bench/gemm_vs_cublas.py "${gvc[@]}" --out "$OUT/cublas_b1.json" > "$OUT/cublas_b1.log" 2>&1
wait
CUDA_VISIBLE_DEVICES=1 run_a bench/gemm_vs_cublas.py "${gvc[@]}" --out "$OUT/cublas_a1.json" > "$OUT/cublas_a1.log" 2>&1 &
CUDA_VISIBLE_DEVICES=0 run_b bench/gemm_vs_cublas.py "${gvc[@]}" --out "$OUT/cublas_b0.json" > "$OUT/cublas_b0.log" 2>&1
wait
probe=(--configs "$PROBE" --shapes 8192x8192 --m "$M")
run_a bench/config_probe.py "${probe[@]}" --out "$OUT/probe_a.json" > "$OUT/probe_a.log" 2>&1
run_b bench/config_probe.py "${probe[@]}" --out "$OUT/probe_b.json" > "$OUT/probe_b.log" 2>&1
run_a bench/config_probe.py "${probe[@]}" --out "$OUT/probe_a2.json" > "$OUT/probe_a2.log" 2>&1
grep -h "fused ratio\|WRONG\|Error" "$OUT"/cublas_*.log | head -40
for f in probe_a probe_b probe_a2; do echo "== $f"; grep -v "^\s*$" "$OUT/$f.log" | tail -40; done
