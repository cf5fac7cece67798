# 1 GPU, issue 47: the fused kernels' GEMM core (push / push_tma consumer at one rank, no waits) against
# cuBLAS at the TP4 layer's keys, nk and kn, side by side
set -u
source bench/device.sh || exit 1
nvidia-smi -L | tee $OUT/gpu.txt
CF="128,256,64,8,8,3,0;128,256,64,8,8,4,0;128,128,64,8,8,4,0;128,128,64,8,4,4,0;128,128,64,8,4,5,0;64,128,64,8,4,4,0;64,256,64,8,8,3,0"
t0=$SECONDS
run() { name=$1; shift; timeout -k 10 "$@" > $OUT/$name.log 2>&1; echo "$name rc=$? $((SECONDS-t0))s"; }
run ag_nk_small 150 python3 -P bench/gemm_vs_cublas.py --fused --tma --b-layout nk --shapes 2560x8192,14336x8192 --ms 1024,4096 --configs "$CF" --out $OUT/ag_nk_small.json
run ag_kn_small 120 python3 -P bench/gemm_vs_cublas.py --fused --tma --b-layout kn --shapes 2048x8192,7168x8192 --ms 1024,4096 --configs "$CF" --out $OUT/ag_kn_small.json
run rs_nk_small 120 python3 -P bench/gemm_vs_cublas.py --fused --tma --b-layout nk --shapes 8192x2048,8192x7168 --ms 1024,4096 --configs "$CF" --out $OUT/rs_nk_small.json
run ag_16k 120 python3 -P bench/gemm_vs_cublas.py --fused --tma --b-layout nk --shapes 2560x8192 --ms 16384 --configs "$CF" --out $OUT/ag_16k.json
for f in $OUT/*.log; do echo "== $f"; grep "^M=" $f | grep -v "side by side" ; grep -i "error\|Trace" $f | head -3; done
