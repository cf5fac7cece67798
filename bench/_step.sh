# Sourced by the device step scripts (device_round3.sh, graph_tables_device.sh).
# step NAME LIMIT_S COMMAND...: run COMMAND under `timeout` (extra options from the STEP_TIMEOUT_OPTS
# array), its output in $OUT/NAME.log, and append "NAME rc=.. seconds | last log line" to `summary`.
summary=()
STEP_TIMEOUT_OPTS=()

step() {
    local name=$1 limit=$2
    shift 2
    local t0=$SECONDS
    timeout ${STEP_TIMEOUT_OPTS[@]+"${STEP_TIMEOUT_OPTS[@]}"} "$limit" "$@" > "$OUT/$name.log" 2>&1
    local rc=$?
    summary+=("$name rc=$rc $((SECONDS - t0))s | $(tail -n 1 "$OUT/$name.log")")
}
