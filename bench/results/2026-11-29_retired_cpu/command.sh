#!/usr/bin/env bash
# 2026-11-29, CPU VM. The analysis (scripts in raw.tar.xz; they read bench/results/ and tuning_db/):
python3 winners.py > report_all.txt
python3 winners.py --h200-only > report_h200.txt
# the records after removing gemm_rs pull (base: the commit before it), under the GPUs' Triton and the VM's:
PYTHONPATH=/tmp/triton36 python -P -m autotaxer.tools.restamp --base c3c6f64 --write   # restamp_triton36.log
python -m autotaxer.tools.restamp --base c3c6f64                                       # restamp_triton39.log
# after moving ce_fanout's narrowed space into its own module:
python -m autotaxer.tools.restamp --base c3c6f64 --write                               # restamp_ce_fanout.log
