#!/usr/bin/env bash
# Source this at the start of a command on a lent GPU machine (repo root as the working directory):
#   source bench/device_env.sh
# Keeps NVLink multicast off, installs the carried wheels (.whl: optuna, sqlalchemy, alembic, iris, ...)
# and this package (non-editable, into a fresh folder: kernels/ must be importable as autotaxer.kernels,
# which a $PWD entry on PYTHONPATH would shadow). Run python as `python3 -P` afterwards.
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
site_deps=/tmp/site
site_pkg=$(mktemp -d /tmp/autotaxer_site.XXXX)
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$site_deps" .whl/*.whl \
    || { echo "wheel install failed" >&2; return 1; }
python3 -m pip install -q --no-deps --no-index --no-build-isolation --target "$site_pkg" . \
    || { echo "package install failed" >&2; return 1; }
export PYTHONPATH="$site_pkg:$site_deps"
export OUT="${OUT:-/tmp/out}"
mkdir -p "$OUT"
