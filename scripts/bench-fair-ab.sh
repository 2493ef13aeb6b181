#!/usr/bin/env bash
# The fair rounds of scripts/bench-peers.sh at two commits, alternated in one run on this
# machine (issue 44: "a fair queue with 10 000 tenants ≥ 0.8 of its one-tenant drain"). Per
# round and side: a fair queue's FAIR_JOBS jobs of one tenant, then FAIR_JOBS jobs of one
# tenant each, filled through that side's ingress and drained by 4 of that side's workers
# (unthrottled, concurrency 16, the queue paused until all four are ready, as bench-peers'
# settled drains), against one nats-server (-js -sd, monitoring on) and one redis-server.
# Each drain prints its rate from the arrivals at a recording upstream, the CPU per job of the
# workers and of nats-server (from /proc), and the JetStream API requests per job (the server's
# /jsz api.total over the drain). Each side has an ingress of its own, with its own queues, so
# that each backlog is made as that side makes it (BEFORE's without the hold consumer).
#
# Usage: scripts/bench-fair-ab.sh BEFORE [AFTER]   (AFTER: the work tree as it is)
# Env: DRAIN_ROUNDS (default 3), FAIR_JOBS (default 10000).
set -euo pipefail
cd "$(dirname "$0")/.."
BEFORE=${1:?usage: scripts/bench-fair-ab.sh BEFORE [AFTER]}
AFTER=${2:-}
DRAIN_ROUNDS=${DRAIN_ROUNDS:-3}
FAIR_JOBS=${FAIR_JOBS:-10000}
W=$(mktemp -d)
cleanup() {
  set +e
  kill $(jobs -p) 2>/dev/null; wait 2>/dev/null
  git worktree remove --force "$W/src-a" 2>/dev/null; git worktree remove --force "$W/src-b" 2>/dev/null
  rm -rf "$W"; true
}
trap cleanup EXIT
command -v redis-server >/dev/null || { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq redis-server >/dev/null; }
build() { # side rev
  local src=.
  if [ -n "$2" ]; then git worktree add -q --detach "$W/src-$1" "$2"; src="$W/src-$1"; fi
  (cd "$src" && go build -o "$W/ingress-$1" ./cmd/ingress && go build -o "$W/worker-$1" ./cmd/worker)
}
build a "$BEFORE"
build b "$AFTER"
go build -o "$W/plain" ./examples/upstream
go build -o "$W/load" ./cmd/load
go build -o "$W/recorder" ./cmd/worker/testdata/upstream
go build -o "$W/nats-server" github.com/nats-io/nats-server/v2

wait_http() { for _ in $(seq 1 200); do curl -s -o /dev/null "$1" && return 0; sleep 0.05; done; echo "no answer from $1" >&2; exit 1; }
wait_ready() { for _ in $(seq 1 400); do curl -sf -o /dev/null "$1" && return 0; sleep 0.05; done; echo "not ready: $1" >&2; exit 1; }
"$W/plain" -ok -listen 127.0.0.1:19700 2>/dev/null &
redis-server --port 19779 --bind 127.0.0.1 --save '' --appendonly no --loglevel warning >/dev/null &
"$W/nats-server" -a 127.0.0.1 -p 19722 -m 19723 -js -sd "$W/js" >/dev/null 2>&1 & NATS_PID=$!
wait_http http://127.0.0.1:19700/
wait_http http://127.0.0.1:19723/varz
mkdir -p "$W/rec"
"$W/recorder" > "$W/rec/arrivals" &
for _ in $(seq 1 100); do [ -s "$W/rec/arrivals" ] && break; sleep 0.05; done
REC=$(head -1 "$W/rec/arrivals")

head_yaml() { # side port
  cat <<YAML
listen: 127.0.0.1:$2
admin_listen: 127.0.0.1:$(($2 + 1000))
upstream: http://127.0.0.1:19700
nats: { url: nats://127.0.0.1:19722 }
redis: { url: redis://127.0.0.1:19779/0 }
shutdown_timeout: 1s
queues:
YAML
}
qline() { # name
  echo "  - { name: $1, rate: 1000000/s, concurrency: 16, max_depth: 10000000, tenant: \"header:X-Tenant\", fair: true, target: \"POST $REC/sluice/$1\" }"
}
declare -A PORT=([a]=19701 [b]=19702)
for side in a b; do
  { head_yaml "$side" "${PORT[$side]}"
    for r in $(seq 1 "$DRAIN_ROUNDS"); do qline "${side}one$r"; qline "${side}many$r"; done
  } > "$W/ingress-$side.yaml"
  "$W/ingress-$side" -config "$W/ingress-$side.yaml" 2>"$W/ingress-$side.log" &
  wait_ready "http://127.0.0.1:$((${PORT[$side]} + 1000))/readyz"
done

TCK=$(getconf CLK_TCK)
cpu_ticks() { local t=0; for p in "$@"; do t=$((t + $(awk '{print $14 + $15}' "/proc/$p/stat"))); done; echo "$t"; }
api_total() { curl -s http://127.0.0.1:19723/jsz | sed -n 's/.*"total": *\([0-9]*\).*/\1/p' | head -1; }
stats() { # uri jobs: waits for the jobs, prints "rate/s"
  for _ in $(seq 1 3000); do
    [ "$(grep -c " $1 " "$W/rec/arrivals" || true)" -ge "$2" ] && break; sleep 0.1
  done
  grep " $1 " "$W/rec/arrivals" | awk '{print $1}' | sort -n | awk '
    { t[NR] = $1 } END { printf "%.1f", (NR - 1) / ((t[NR] - t[1]) / 1e9) }'
}
fill() { # side queue jobs [load flags]
  local side=$1 q=$2 n=$3; shift 3
  "$W/load" -url "http://127.0.0.1:${PORT[$side]}/v1/queues/$q/jobs" -method POST -body x -c 32 -n "$n" -warmup 0 -d 10m "$@" >/dev/null
}
drain() { # side queue jobs: prints "rate workers-µs/job nats-µs/job api/job"
  local side=$1 q=$2 n=$3 pids=()
  local admin=$((${PORT[$side]} + 1000))
  curl -s -o /dev/null -X POST "http://127.0.0.1:$admin/v1/queues/$q/pause"
  for i in 1 2 3 4; do
    { head_yaml "$side" "$((19710 + i))"; qline "$q"; } > "$W/worker$i.yaml"
    "$W/worker-$side" -config "$W/worker$i.yaml" 2>"$W/worker$i.log" & pids+=($!)
  done
  for i in 1 2 3 4; do
    for _ in $(seq 1 200); do [ "$(curl -s -o /dev/null -w '%{http_code}' "http://127.0.0.1:$((20710 + i))/readyz")" = 200 ] && break; sleep 0.05; done
  done
  local c0 n0 a0; c0=$(cpu_ticks "${pids[@]}"); n0=$(cpu_ticks "$NATS_PID"); a0=$(api_total)
  curl -s -o /dev/null -X POST "http://127.0.0.1:$admin/v1/queues/$q/resume"
  local rate; rate=$(stats "/sluice/$q" "$n")
  local c1 n1 a1; c1=$(cpu_ticks "${pids[@]}"); n1=$(cpu_ticks "$NATS_PID"); a1=$(api_total)
  awk -v r="$rate" -v w=$((c1 - c0)) -v s=$((n1 - n0)) -v a=$((a1 - a0)) -v t="$TCK" -v n="$n" \
    'BEGIN {printf "%s %.0f %.0f %.2f\n", r, w / t * 1e6 / n, s / t * 1e6 / n, a / n}'
  kill "${pids[@]}"; wait "${pids[@]}" 2>/dev/null || true
}
median() { tr ' ' '\n' | grep . | sort -g | awk '{a[NR]=$1} END {print (NR%2 ? a[(NR+1)/2] : (a[NR/2]+a[NR/2+1])/2)}'; }

echo "# $(date -u +%F) $(nproc) cores, $(go version | cut -d' ' -f3); a = $BEFORE, b = ${AFTER:-work tree}; $FAIR_JOBS jobs, $DRAIN_ROUNDS rounds"
echo
echo '| round | side | 1 tenant jobs/s | workers µs/job | nats µs/job | API/job | '"$FAIR_JOBS"' tenants jobs/s | workers µs/job | nats µs/job | API/job | ratio |'
echo '|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|'
declare -A R
for r in $(seq 1 "$DRAIN_ROUNDS"); do
  for side in a b; do
    fill "$side" "${side}one$r" "$FAIR_JOBS" -header "X-Tenant: t0"; one=$(drain "$side" "${side}one$r" "$FAIR_JOBS")
    fill "$side" "${side}many$r" "$FAIR_JOBS" -unique-header X-Tenant; many=$(drain "$side" "${side}many$r" "$FAIR_JOBS")
    set -- $one; o=$1; set -- $many
    ratio=$(awk -v a="$1" -v b="$o" 'BEGIN {printf "%.2f", a / b}'); R[$side]+=" $ratio"
    printf '| %s | %s | %s | %s | %s |\n' "$r" "$side" "$(sed 's/ / | /g' <<<"$one")" "$(sed 's/ / | /g' <<<"$many")" "$ratio"
  done
done
echo
for side in a b; do
  echo "$side: ratio per round${R[$side]}, median $(median <<<"${R[$side]}"), least $(tr ' ' '\n' <<<"${R[$side]}" | grep . | sort -g | head -1)"
done
