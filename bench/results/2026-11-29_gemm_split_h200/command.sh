# 2026-11-29, nvidia-h200 (one NVIDIA H200), from the repository root
source bench/device.sh
python3 -P bench/gemm_split.py --out $OUT/gemm_split.json
