#!/usr/bin/env bash
# Whole-process figures for BENCHMARKS.md, all in one run on this machine (loopback only):
#   A  plain Go net/http "ok" server                      (the reference)
#   B  ingress 429 path, in-memory limiter               (target ≥ 0.85 × A's req/s)
#   C  ingress forwarding to A, in-memory limiter         (added p50 vs A at 1 connection: target ≤ 150 µs)
#   D  ingress 429 path, Redis limiter                    (target ≥ 0.8 × B)
#   E  ingress forwarding to A, Redis limiter
#   F  defer path: POST → JetStream (nats-server process, file store) → 202
#                                                         (target ≥ 25k/s, p99 ≤ 10 ms)
#   G  raw JetStream publish rate in the same run (queue package benchmarks)
# Needs wrk and redis-server (apt-get install -y wrk redis-server). Usage: scripts/bench-ingress.sh [seconds]
set -euo pipefail
cd "$(dirname "$0")/.."
DUR=${1:-10}
W=$(mktemp -d)
trap 'kill $(jobs -p) 2>/dev/null; wait 2>/dev/null; rm -rf "$W"' EXIT

go build -o "$W/ingress" ./cmd/ingress
go build -o "$W/upstream" ./examples/upstream
go build -o "$W/load" ./cmd/load
go build -o "$W/nats-server" github.com/nats-io/nats-server/v2

wait_http() { for _ in $(seq 1 200); do curl -s -o /dev/null "$1" && return 0; sleep 0.05; done; echo "no answer from $1" >&2; exit 1; }
# wait_ready <url>: until it answers 2xx (an ingress opens its queues after its listeners)
wait_ready() { for _ in $(seq 1 400); do curl -sf -o /dev/null "$1" && return 0; sleep 0.05; done; echo "not ready: $1" >&2; exit 1; }
wrk_run() { # name url [connections]
  local out; out=$(wrk -t"$(( ${3:-64} < 2 ? 1 : 2 ))" -c"${3:-64}" -d"${DUR}s" --latency "$2")
  local rps p50 p99
  rps=$(awk '/Requests\/sec/ {print $2}' <<<"$out")
  p50=$(awk '$1=="50%" {print $2}' <<<"$out")
  p99=$(awk '$1=="99%" {print $2}' <<<"$out")
  local non2xx; non2xx=$(awk '/Non-2xx/ {print $5}' <<<"$out")
  printf '| %s | %s | %s | %s | %s |\n' "$1" "$rps" "$p50" "$p99" "${non2xx:-0}"
}

"$W/upstream" -ok -listen 127.0.0.1:19100 2>/dev/null &
redis-server --port 19379 --bind 127.0.0.1 --save '' --appendonly no --daemonize no --loglevel warning >/dev/null &
"$W/nats-server" -a 127.0.0.1 -p 19422 -js -sd "$W/js" >/dev/null 2>&1 &
wait_http http://127.0.0.1:19100/

cfg() { # name listen admin redis? rule-limit
  local redis=""; [ "$3" = redis ] && redis="redis: { url: redis://127.0.0.1:19379/0 }"
  cat > "$W/$1.yaml" <<YAML
listen: $2
admin_listen: 127.0.0.1:$((${2##*:} + 1000))
upstream: http://127.0.0.1:19100
data_dir: $W/data-$1
nats: { url: nats://127.0.0.1:19422 }
$redis
queues:
  - { name: bench-$1, rate: 100/s, max_depth: 10000000 }
rules:
  - name: orders
    match: { methods: [POST], path: /api/orders }
    action: enqueue
    queue: bench-$1
  - name: all
    match: { methods: [GET] }
    key: [const:all]
    algorithm: token_bucket
    limit: $4
    period: 1h
YAML
  "$W/ingress" -config "$W/$1.yaml" 2>"$W/$1.log" &
  wait_ready "http://127.0.0.1:$((${2##*:} + 1000))/readyz"
}
cfg mem429 127.0.0.1:19201 mem 1
cfg memfwd 127.0.0.1:19202 mem 1000000000000
cfg red429 127.0.0.1:19203 redis 1
cfg redfwd 127.0.0.1:19204 redis 1000000000000
curl -s -o /dev/null http://127.0.0.1:19201/x; curl -s -o /dev/null http://127.0.0.1:19203/x  # spend the one token

echo "# $(date -u +%F) $(nproc) cores, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs), $(go version | cut -d' ' -f3), wrk -t2 -c64 -d${DUR}s"
echo
echo '| run | req/s | p50 | p99 | non-2xx |'
echo '|---|---|---|---|---|'
wrk_run "A plain net/http ok server" http://127.0.0.1:19100/x
wrk_run "B ingress 429, memory" http://127.0.0.1:19201/x
wrk_run "C ingress forward, memory" http://127.0.0.1:19202/x
wrk_run "D ingress 429, Redis" http://127.0.0.1:19203/x
wrk_run "E ingress forward, Redis" http://127.0.0.1:19204/x
echo
echo "Added latency of the forward path, one connection (no queueing for the CPU):"
echo
echo '| run | req/s | p50 | p99 | non-2xx |'
echo '|---|---|---|---|---|'
wrk_run "A1 plain server, 1 connection" http://127.0.0.1:19100/x 1
wrk_run "C1 ingress forward, memory, 1 connection" http://127.0.0.1:19202/x 1
wrk_run "E1 ingress forward, Redis, 1 connection" http://127.0.0.1:19204/x 1
echo
echo "F defer path (cmd/load, POST 64-byte JSON, 64 connections, ${DUR}s):"
"$W/load" -url http://127.0.0.1:19202/api/orders -method POST -header 'Content-Type: application/json' \
  -body '{"order":"0123456789","items":[1,2,3],"note":"benchmark payload.."}' -c 64 -d "${DUR}s"
echo
echo "G raw JetStream publish in the same run (queue package, embedded server, 16 goroutines):"
go test -run '^$' -bench 'BenchmarkPublish' -benchtime 2s ./queue/ | grep -E '^Benchmark'
