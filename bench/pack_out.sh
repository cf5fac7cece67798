#!/usr/bin/env bash
# Keep what comes back from $OUT within the device tool's limit (8 files): checkpoint SQLite files (so
# no -wal/-shm file is needed beside them), keep the files named as arguments, pack the rest in misc.tgz.
#   bash bench/pack_out.sh KEEP_NAME [KEEP_NAME ...]
set -u
: "${OUT:?source bench/device_env.sh first}"
cd "$OUT" || exit 1
for db in *.sqlite *.db; do
    [ -f "$db" ] || continue
    python3 -c "import sqlite3, sys; c = sqlite3.connect(sys.argv[1]); c.execute('PRAGMA wal_checkpoint(TRUNCATE)'); c.execute('PRAGMA journal_mode=DELETE'); c.close()" "$db"
done
rest=()
for f in *; do
    [ -f "$f" ] || continue
    keep=0
    for k in "$@"; do [ "$f" = "$k" ] && keep=1; done
    [ $keep = 1 ] || rest+=("$f")
done
if [ ${#rest[@]} -gt 0 ]; then
    tar czf misc.tgz "${rest[@]}" && rm -f "${rest[@]}"
fi
ls -la "$OUT"
