# Sourced by the served benchmarks (run_all.sh, serve_interval_ab.sh): one server
# at a time, each in its own session (process group) so that stopping it can
# never leave its workers / engine core behind. Sets an EXIT trap that stops it.
SERVER_PID=
stop_server() {
  [[ -n $SERVER_PID ]] || return 0
  kill -INT "$SERVER_PID" 2>/dev/null || true
  for _ in $(seq 60); do
    kill -0 "$SERVER_PID" 2>/dev/null || break
    sleep 1
  done
  # Whatever is left of its group (a child that outlived its parent).
  kill -KILL -- "-$SERVER_PID" 2>/dev/null || true
  wait "$SERVER_PID" 2>/dev/null || true
  SERVER_PID=
}
trap stop_server EXIT

start_server() {  # start_server PORT LOG CMD...: start, wait until /health says 200
  local port=$1 log=$2
  shift 2
  setsid "$@" >"$log" 2>&1 &
  SERVER_PID=$!
  for _ in $(seq 900); do
    curl -sf "http://127.0.0.1:$port/health" >/dev/null && return 0
    if ! kill -0 "$SERVER_PID" 2>/dev/null; then
      echo "error: the server died before it was healthy; the end of $log:" >&2
      tail -20 "$log" >&2
      SERVER_PID=
      return 1
    fi
    sleep 1
  done
  echo "error: no healthy server on port $port after 900 s ($log)" >&2
  return 1
}
