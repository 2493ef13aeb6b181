#!/usr/bin/env bash
# Many queues on a stock nats-server (BENCHMARKS.md, "Issue 44: many queues and the drain, where they stand"): for each
# configuration, a fresh `nats-server -js -sd DIR` with its default limits (built from the
# nats-server module this repository requires), a fresh redis-server, one ingress and W workers
# (cmd/ingress, cmd/worker) on a config of N queues of rate 10/s with no max_bytes, all started
# at once. It prints, per configuration:
#
#   ready      time from the start of the processes to /readyz 200: the ingress's, and the
#              slowest of all (the workers'), on the fresh server and again on restarting the
#              processes with the server warm (streams and consumers made)
#   first      how long the first job, posted the moment every process is ready, takes to reach
#              its upstream (a random queue)
#   idle CPU   % of a core over the IDLE seconds that follow ready: nats-server, the ingress,
#              the busiest worker
#   RSS        after that: nats-server, the ingress, the largest worker
#   wake       p50 / p99 / max of SAMPLES jobs, one at a time 100 ms apart, each on a random
#              idle queue, from POST to the upstream (scripts/wakeprobe): "first" is each
#              queue's first job (which makes the queue's admission ledger), "again" a second
#              run on the same queues in the same order, each idle since its first job
#
#   load       the machine's 1-minute load average when the configuration started and ended
#              (other processes on the machine stretch every time above)
#
# Usage: scripts/bench-many-queues.sh [configs] [idle seconds] [samples]
#   configs: space-separated NxW, default "1000x2 1000x4 10000x2 10000x4"
# Environment: BIN=dir runs the ingress and worker binaries in dir instead of building them
# (an A/B against another commit's build); READY_TIMEOUT (seconds, default 300) bounds the
# wait for a process's /readyz: a process not ready by then is reported as such and the
# configuration is skipped. Unset, SHARED leaves nats.shared_streams out of the config: the
# default, 16 shared streams (the queues' jobs as subjects of them, runners on demand:
# docs/scaling.md). SHARED=S sets nats.shared_streams: S; SHARED=0, every queue has a stream
# of its own. PORT_BASE=P moves the run's ports (P to P+23; default 19700).
set -euo pipefail
cd "$(dirname "$0")/.."
CONFIGS=${1:-"1000x2 1000x4 10000x2 10000x4"}
IDLE=${2:-10}
SAMPLES=${3:-100}
READY_TIMEOUT=${READY_TIMEOUT:-300}
# The count in effect: SHARED, or the config's default (internal/config.DefaultSharedStreams).
STREAMS=${SHARED:-16}
W=$(mktemp -d)
cleanup() { set +e; kill $(jobs -p) 2>/dev/null; wait 2>/dev/null; rm -rf "$W"; true; }
trap cleanup EXIT

if [ -n "${BIN:-}" ]; then
  cp "$BIN/ingress" "$BIN/worker" "$W/"
else
  go build -o "$W/ingress" ./cmd/ingress
  go build -o "$W/worker" ./cmd/worker
fi
go build -o "$W/wakeprobe" ./scripts/wakeprobe
go build -o "$W/nats-server" github.com/nats-io/nats-server/v2

# PORT_BASE (default 19700) moves every port the run listens on, so that two runs on one
# machine do not answer each other's probes.
B=${PORT_BASE:-19700}
for p in $B $((B + 1)) $((B + 2)) $((B + 22)) $((B + 23)); do
  if (exec 3<>/dev/tcp/127.0.0.1/$p) 2>/dev/null; then echo "port $p is in use (another run?): set PORT_BASE" >&2; exit 1; fi
done
UP=127.0.0.1:$B
PUB=127.0.0.1:$((B + 1))
ADM=127.0.0.1:$((B + 2))
NATSP=$((B + 22))
REDISP=$((B + 23))
now_ms() { echo $(($(date +%s%N) / 1000000)); }
ticks() { awk '{print $14 + $15}' "/proc/$1/stat"; }
rss_mib() { awk '/VmRSS/ {printf "%.0f", $2 / 1024}' "/proc/$1/status"; }
wait_up() { for _ in $(seq 1 400); do curl -s -o /dev/null "$1" && return 0; sleep 0.025; done; echo "no answer from $1" >&2; exit 1; }
load1() { cut -d' ' -f1 /proc/loadavg; }
# ready_at <url> <t0> <file>: writes the ms from t0 to the first 200 of url, or "timeout"
# after READY_TIMEOUT seconds
ready_at() {
  until curl -sf -o /dev/null "$1"; do
    if [ $(($(now_ms) - $2)) -gt $((READY_TIMEOUT * 1000)) ]; then echo timeout > "$3"; return; fi
    sleep 0.025
  done
  echo $(($(now_ms) - $2)) > "$3"
}

# start_procs: the ingress and NW workers on $R's configs, at once; returns when all are ready,
# each one's time to ready (ms from the start) in $R/ready-*
start_procs() {
  local t0 i
  t0=$(now_ms)
  "$W/ingress" -config "$R/ingress.yaml" 2>>"$R/ingress.log" &
  PIDS=($!)
  for i in $(seq 1 "$NW"); do
    SLUICE_ADMIN_LISTEN=127.0.0.1:$((B + 10 + i)) "$W/worker" -config "$R/worker.yaml" 2>>"$R/worker$i.log" &
    PIDS+=($!)
  done
  ready_at "http://$ADM/readyz" "$t0" "$R/ready-ingress" &
  WAITERS=($!)
  for i in $(seq 1 "$NW"); do ready_at "http://127.0.0.1:$((B + 10 + i))/readyz" "$t0" "$R/ready-worker$i" & WAITERS+=($!); done
  wait "${WAITERS[@]}"
}
# max_ready: the slowest of the processes' times to ready, ingress included
max_ready() { if grep -q timeout "$R"/ready-*; then echo timeout; else cat "$R"/ready-* | sort -n | tail -1; fi; }
# fmt_ms: a time to ready as the table prints it
fmt_ms() { if [ "$1" = timeout ]; then echo "not ready in ${READY_TIMEOUT}s"; else echo "$1 ms"; fi; }

"$W/wakeprobe" -listen "$UP" -ingress "http://$PUB" &
wait_up "http://$UP/q/"

echo "# $(date -u +%F) $(nproc) cores, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs), $(go version | cut -d' ' -f3), commit $(git rev-parse --short HEAD)"
echo "# stock nats-server -js -sd DIR (default limits), queues of rate 10/s without max_bytes, nats.shared_streams ${SHARED:-unset (default $STREAMS)}, idle ${IDLE}s from ready, wake over $SAMPLES jobs"
echo
if [ "$STREAMS" != 0 ]; then
  # With shared streams a runner stops after 30 s idle: "stopped" is a third run on the same
  # queues once every runner the first two started has stopped (35 s after them).
  echo '| queues × workers | ingress ready | all ready (slowest) | all ready, warm restart | first job | idle CPU nats / ingress / worker (max) | RSS MiB nats / ingress / worker (max) | wake p50 / p99 / max, first | wake p50 / p99 / max, again | wake p50 / p99 / max, runners stopped | load |'
  echo '|---|---:|---:|---:|---:|---|---|---|---|---|---|'
else
  echo '| queues × workers | ingress ready | all ready (slowest) | all ready, warm restart | first job | idle CPU nats / ingress / worker (max) | RSS MiB nats / ingress / worker (max) | wake p50 / p99 / max, first | wake p50 / p99 / max, again | load |'
  echo '|---|---:|---:|---:|---:|---|---|---|---|---|'
fi
for c in $CONFIGS; do
  N=${c%x*} NW=${c#*x}
  R="$W/run-$c"
  mkdir -p "$R"
  "$W/nats-server" -a 127.0.0.1 -p $NATSP -js -sd "$R/js" >"$R/nats.log" 2>&1 &
  NATS=$!
  redis-server --port $REDISP --bind 127.0.0.1 --save '' --appendonly no >"$R/redis.log" 2>&1 &
  REDIS=$!
  until redis-cli -p $REDISP ping >/dev/null 2>&1; do sleep 0.02; done
  until (exec 3<>/dev/tcp/127.0.0.1/$NATSP) 2>/dev/null; do sleep 0.02; done
  {
    echo "redis: { url: redis://127.0.0.1:$REDISP }"
    echo "nats: { url: nats://127.0.0.1:$NATSP${SHARED:+, shared_streams: $SHARED} }"
    echo "queues:"
    for i in $(seq 0 $((N - 1))); do printf '  - { name: q%04d, rate: 10/s, target: POST http://%s/q/q%04d }\n' "$i" "$UP" "$i"; done
  } > "$R/common.yaml"
  { echo "listen: $PUB"; echo "admin_listen: $ADM"; cat "$R/common.yaml"; } > "$R/ingress.yaml"
  cp "$R/common.yaml" "$R/worker.yaml"

  load0=$(load1)
  start_procs
  if [ "$(max_ready)" = timeout ]; then
    printf '| %d × %d | %s | %s | — | — | — | — | — | — | %s |\n' "$N" "$NW" "$(fmt_ms "$(cat "$R/ready-ingress")")" "$(fmt_ms timeout)" "$load0"
    kill "${PIDS[@]}" "$NATS" "$REDIS" 2>/dev/null; wait "${PIDS[@]}" "$NATS" "$REDIS" 2>/dev/null || true
    if [ -n "${KEEP:-}" ]; then mkdir -p "$KEEP/$c"; cp "$R"/*.log "$KEEP/$c/"; fi
    rm -rf "$R/js"
    continue
  fi
  first=$(curl -sf "http://$UP/run?samples=1&gap=0s&queues=$N" | awk '{print $1}')

  declare -A T0=()
  for p in "$NATS" "${PIDS[@]}"; do T0[$p]=$(ticks "$p"); done
  sleep "$IDLE"
  cpu() { awk -v t=$(($(ticks "$1") - T0[$1])) -v hz="$(getconf CLK_TCK)" -v d="$IDLE" 'BEGIN {printf "%.1f", t / hz / d * 100}'; }
  wcpu=0 wrss=0 wready=$(max_ready)
  for i in $(seq 1 "$NW"); do
    p=${PIDS[$i]}
    wcpu=$(awk -v a="$wcpu" -v b="$(cpu "$p")" 'BEGIN {print (b > a ? b : a)}')
    r=$(rss_mib "$p"); [ "$r" -gt "$wrss" ] && wrss=$r
  done
  idle="$(cpu "$NATS")% / $(cpu "${PIDS[0]}")% / ${wcpu}%"
  rss="$(rss_mib "$NATS") / $(rss_mib "${PIDS[0]}") / $wrss"
  wake=$(curl -sf "http://$UP/run?samples=$SAMPLES&gap=100ms&queues=$N&seed=7" | awk '{printf "%s / %s / %s ms", $1, $2, $3}')
  again=$(curl -sf "http://$UP/run?samples=$SAMPLES&gap=100ms&queues=$N&seed=7" | awk '{printf "%s / %s / %s ms", $1, $2, $3}')
  if [ "$STREAMS" != 0 ]; then
    sleep 35
    stopped="$(curl -sf "http://$UP/run?samples=$SAMPLES&gap=100ms&queues=$N&seed=7" | awk '{printf "%s / %s / %s ms", $1, $2, $3}') | "
  else
    stopped=""
  fi
  iready=$(cat "$R/ready-ingress")

  # The same processes again on the warm server: the streams and consumers exist.
  kill "${PIDS[@]}" 2>/dev/null; wait "${PIDS[@]}" 2>/dev/null || true
  rm -f "$R"/ready-*
  start_procs
  warm=$(max_ready)
  kill "${PIDS[@]}" 2>/dev/null; wait "${PIDS[@]}" 2>/dev/null || true
  kill "$NATS" "$REDIS" 2>/dev/null; wait "$NATS" "$REDIS" 2>/dev/null || true
  printf '| %d × %d | %s | %s | %s | %s ms | %s | %s | %s | %s | %s%s–%s |\n' "$N" "$NW" "$(fmt_ms "$iready")" "$(fmt_ms "$wready")" "$(fmt_ms "$warm")" "$first" "$idle" "$rss" "$wake" "$again" "$stopped" "$load0" "$(load1)"
  if grep -q "10047\|cannot be provisioned" "$R"/*.log; then echo "  (some queues could not be provisioned: see the logs)"; fi
  if [ -n "${KEEP:-}" ]; then mkdir -p "$KEEP/$c"; cp "$R"/*.log "$KEEP/$c/"; fi
  rm -rf "$R/js"
done
