# 2026-11-29, nvidia-h200 (one NVIDIA H200), from the repository root
source bench/device.sh
python3 -P bench/gemm_split.py --out $OUT/gemm_split.json
# gemm_split_sequential.json: the first run, at commit 9a54c51 (each form timed alone, median of 9
# replays; no local+rest_copied form yet)
python3 -P bench/results/2026-11-29_gemm_split_h200/copy_probe.py > $OUT/copy_probe.txt
# gemm_split.json: the final run of the script as committed with it (autotaxer.measure.time_interleaved)
