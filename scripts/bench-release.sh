#!/usr/bin/env bash
# What a job's exit costs nats-server, at two commits side by side in one run (BENCHMARKS.md,
# "Release by acknowledgement"): one worker (concurrency 16) drains JOBS jobs of an unthrottled
# queue into a recording upstream; per job, over the drain (from the queue's resume until every
# job arrived and its ledger is empty): messages into nats-server (/varz in_msgs), JetStream
# API requests (/jsz api.total), nats-server's CPU and the worker's (/proc). Rounds alternate
# who goes first. CPU per job and request counts are the steady figures on a shared machine;
# the wall rate is printed too and is noisy. Beside the drain, nats-server's CPU per job of the
# intake: from the load's start until the server is idle again (a ticket's delivery to its
# ledger's hold consumer follows its store).
#
# Usage: scripts/bench-release.sh BEFORE [AFTER] [rounds] [jobs]
# BEFORE and AFTER are commits (AFTER defaults to the work tree as it is); KEEP=1 keeps the
# work directory (configs, logs) and prints its path.
set -euo pipefail
cd "$(dirname "$0")/.."
BEFORE=${1:?usage: scripts/bench-release.sh BEFORE [AFTER] [rounds] [jobs]}
AFTER=${2:-}
ROUNDS=${3:-3}
JOBS=${4:-20000}
W=$(mktemp -d)
cleanup() {
  set +e
  kill $(jobs -p) 2>/dev/null; wait 2>/dev/null
  git worktree remove --force "$W/src-a" 2>/dev/null; git worktree remove --force "$W/src-b" 2>/dev/null
  [ -n "${KEEP:-}" ] && echo "kept $W" >&2 || rm -rf "$W"; true
}
trap cleanup EXIT

build() { # side rev
  local src=.
  if [ -n "$2" ]; then git worktree add -q --detach "$W/src-$1" "$2"; src="$W/src-$1"; fi
  (cd "$src" && go build -o "$W/ingress-$1" ./cmd/ingress && go build -o "$W/worker-$1" ./cmd/worker)
}
build a "$BEFORE"
build b "$AFTER"
go build -o "$W/load" ./cmd/load
go build -o "$W/recorder" ./cmd/worker/testdata/upstream
go build -o "$W/nats-server" github.com/nats-io/nats-server/v2

redis-server --port 19779 --bind 127.0.0.1 --save '' --appendonly no --loglevel warning >/dev/null &
MON=http://127.0.0.1:18322
"$W/nats-server" -a 127.0.0.1 -p 19722 -m 18322 -js -sd "$W/js" >/dev/null 2>&1 &
NATS_PID=$!
mkdir -p "$W/rec"
"$W/recorder" > "$W/rec/arrivals" &
for _ in $(seq 1 100); do [ -s "$W/rec/arrivals" ] && curl -s -o /dev/null $MON/varz && break; sleep 0.05; done
REC=$(head -1 "$W/rec/arrivals")

config() { # side port
  cat <<YAML
listen: 127.0.0.1:$2
admin_listen: 127.0.0.1:$(($2 + 1000))
upstream: http://127.0.0.1:19600
data_dir: $W/data-$1
nats: { url: nats://127.0.0.1:19722 }
redis: { url: redis://127.0.0.1:19779/0 }
shutdown_timeout: 1s
queues:
  - { name: unthrottled-$1, rate: 1000000/s, concurrency: 16, max_depth: 10000000, target: "POST $REC/$1/unthrottled" }
rules:
  - { name: all, match: { methods: [GET] }, key: [const:all], algorithm: token_bucket, limit: 1, period: 1h }
YAML
}
declare -A PORT=([a]=19711 [b]=19712)
for s in a b; do
  config "$s" "${PORT[$s]}" > "$W/drain-$s.yaml"
  "$W/ingress-$s" -config "$W/drain-$s.yaml" 2>"$W/ingress-$s.log" &
done
for s in a b; do
  for _ in $(seq 1 400); do curl -sf -o /dev/null "http://127.0.0.1:$((${PORT[$s]} + 1000))/readyz" && break; sleep 0.05; done
done

cpu() { awk '{print $14 + $15}' "/proc/$1/stat"; } # utime + stime, clock ticks
TCK=$(getconf CLK_TCK)
counters() { # → "in_msgs api_total"
  echo "$(curl -s $MON/varz | jq .in_msgs) $(curl -s $MON/jsz | jq .api.total)"
}
held() { # side → messages in the queue's streams and ledgers (jobs and tickets left)
  curl -s "$MON/jsz?accounts=true&streams=true" | jq "[.account_details[]?.stream_detail[]? | select(.name | test(\"_(Q|A|L)_unthrottled-$1\$\")) | .state.messages] | add // 0"
}
declare -A R SENT
add() { R[$1]="${R[$1]:-} $2"; }
drain() { # side
  local port=${PORT[$1]} admin=$((${PORT[$1]} + 1000)) key="/$1/unthrottled"
  SENT[$1]=$(( ${SENT[$1]:-0} + JOBS ))
  curl -s -o /dev/null -X POST "http://127.0.0.1:$admin/v1/queues/unthrottled-$1/pause"
  local l0; l0=$(cpu $NATS_PID)
  "$W/load" -url "http://127.0.0.1:$port/v1/queues/unthrottled-$1/jobs" -method POST -body x -c 32 -n "$JOBS" -warmup 0 -d 10m >/dev/null
  sed "s/admin_listen: .*/admin_listen: 127.0.0.1:20730/" "$W/drain-$1.yaml" > "$W/worker-$1.yaml"
  # The hold consumer delivers each ticket soon after its store: wait for the server to settle
  # (its CPU still for 1 s) before the intake's CPU is read.
  local l1 l2; l1=$(cpu $NATS_PID); sleep 1; l2=$(cpu $NATS_PID)
  while [ $((l2 - l1)) -gt 2 ]; do l1=$l2; sleep 1; l2=$(cpu $NATS_PID); done
  add "intake-$1" "$(awk -v a="$l0" -v b="$l1" -v j="$JOBS" -v t="$TCK" 'BEGIN {printf "%.0f", (b - a) / t / j * 1e6}')"
  "$W/worker-$1" -config "$W/worker-$1.yaml" 2>"$W/worker-$1.log" & local wpid=$!
  for _ in $(seq 1 200); do [ "$(curl -s -o /dev/null -w '%{http_code}' http://127.0.0.1:20730/readyz)" = 200 ] && break; sleep 0.05; done
  read -r in0 api0 < <(counters); local n0 w0 t0
  n0=$(cpu $NATS_PID); w0=$(cpu $wpid); t0=$(date +%s.%N)
  curl -s -o /dev/null -X POST "http://127.0.0.1:$admin/v1/queues/unthrottled-$1/resume"
  for _ in $(seq 1 6000); do
    [ "$(grep -c " $key " "$W/rec/arrivals" || true)" -ge "${SENT[$1]}" ] && break; sleep 0.1
  done
  local t1; t1=$(date +%s.%N)
  for _ in $(seq 1 600); do [ "$(held "$1")" = 0 ] && break; sleep 0.1; done
  read -r in1 api1 < <(counters); local n1 w1
  n1=$(cpu $NATS_PID); w1=$(cpu $wpid)
  kill "$wpid"; wait "$wpid" 2>/dev/null || true
  add "in-$1" "$(awk -v a="$in0" -v b="$in1" -v j="$JOBS" 'BEGIN {printf "%.2f", (b - a) / j}')"
  add "api-$1" "$(awk -v a="$api0" -v b="$api1" -v j="$JOBS" 'BEGIN {printf "%.2f", (b - a) / j}')"
  add "nats-$1" "$(awk -v a="$n0" -v b="$n1" -v j="$JOBS" -v t="$TCK" 'BEGIN {printf "%.0f", (b - a) / t / j * 1e6}')"
  add "worker-$1" "$(awk -v a="$w0" -v b="$w1" -v j="$JOBS" -v t="$TCK" 'BEGIN {printf "%.0f", (b - a) / t / j * 1e6}')"
  add "rate-$1" "$(awk -v a="$t0" -v b="$t1" -v j="$JOBS" 'BEGIN {printf "%.0f", j / (b - a)}')"
}
for round in $(seq 1 "$ROUNDS"); do
  order="a b"; [ $((round % 2)) = 0 ] && order="b a"
  for s in $order; do drain "$s"; done
done

echo "# $(date -u +%F) $(nproc) cores, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs), $(go version | cut -d' ' -f3), load $(cut -d' ' -f1-3 /proc/loadavg)"
echo "# before: $(git rev-parse --short "$BEFORE"), after: ${AFTER:-the work tree at $(git rev-parse --short HEAD)}; $ROUNDS alternating rounds of $JOBS jobs, 1 worker × concurrency 16"
echo
echo '| per job of the drain | before, per round | after, per round |'
echo '|---|---|---|'
for k in intake:nats-server\ CPU\ at\ intake\ \(µs,\ the\ load\ by\ 32\ clients\ and\ what\ follows\ it\) in:messages\ into\ nats-server api:JetStream\ API\ requests nats:nats-server\ CPU\ \(µs\) worker:worker\ CPU\ \(µs\) rate:drain\ rate\ \(jobs/s,\ noisy\); do
  printf '| %s | %s | %s |\n' "${k#*:}" "${R[${k%%:*}-a]# }" "${R[${k%%:*}-b]# }"
done
