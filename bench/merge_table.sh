#!/usr/bin/env bash
# Merge freshly tuned records into a shipped table on any machine (no GPU), in a scratch database:
#   bash bench/merge_table.sh SHIPPED.json NEW.json [OUT.json]
# Every record of NEW.json replaces the shipped one of its key (`autotaxer import --replace`), every other
# shipped record (other ops, other shapes) is kept; OUT.json defaults to SHIPPED.json. Used after a re-tune
# of one op (e.g. the ag_gemm rows of both tables after a kernel change, flash-decode rows kept).
# PYTHON names the interpreter that has autotaxer installed (default: python).
set -euo pipefail
shipped=$1 new=$2 out=${3:-$1}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
db="sqlite:///$tmp/merge.db"
"${PYTHON:-python}" -m autotaxer import "$shipped" --db "$db" -q
"${PYTHON:-python}" -m autotaxer import "$new" --db "$db" --replace -q
"${PYTHON:-python}" -m autotaxer export --db "$db" --out "$tmp/out.json"
mv "$tmp/out.json" "$out"
