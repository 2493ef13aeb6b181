#!/usr/bin/env bash
# What each piece of Sluice's speed machinery buys, measured with and without it in one run
# (BENCHMARKS.md, "Speed machinery, with and without"). Loopback only.
#
#   gcfloor    the ingress's GC floor (internal/gcfloor): the memory 429 path and the defer path
#              of an ingress with the floor, beside the same ingress with GOGC=100, which turns
#              the floor off
#   headers    the 429 written with eight header map entries instead of ten: a net/http server
#              replaying the ingress's 429 as it is (scripts/replay), beside the same server
#              with Content-Length and Cache-Control set as the ingress did before
#   envelope   the hand-written job envelope reader against encoding/json
#              (go test -bench Decode ./queue/)
#   dialahead  connections to the upstream dialed ahead (internal/worker/spare.go): how late
#              a delivery on a new connection reaches a busy upstream, with and without
#              (go test -bench DialAhead ./internal/worker/)
#
# wrk -t2 -c64, ROUNDS interleaved rounds of DUR seconds; req/s and the server's CPU per request
# (from /proc/PID/stat). Installs wrk (apt) when missing. Usage:
# scripts/bench-machinery.sh [seconds per run] [rounds]
set -euo pipefail
cd "$(dirname "$0")/.."
DUR=${1:-4}
ROUNDS=${2:-5}
W=$(mktemp -d)
cleanup() { set +e; kill $(jobs -p) 2>/dev/null; wait 2>/dev/null; rm -rf "$W"; true; }
trap cleanup EXIT
command -v wrk >/dev/null || { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq wrk >/dev/null; }

go build -o "$W/ingress" ./cmd/ingress
go build -o "$W/plain" ./examples/upstream
go build -o "$W/replay" ./scripts/replay
go build -o "$W/nats-server" github.com/nats-io/nats-server/v2

wait_http() { for _ in $(seq 1 200); do curl -s -o /dev/null "$1" && return 0; sleep 0.05; done; echo "no answer from $1" >&2; exit 1; }
# wait_ready <url>: until it answers 2xx (an ingress opens its queues after its listeners)
wait_ready() { for _ in $(seq 1 400); do curl -sf -o /dev/null "$1" && return 0; sleep 0.05; done; echo "not ready: $1" >&2; exit 1; }

"$W/plain" -ok -listen 127.0.0.1:19500 2>/dev/null &
"$W/nats-server" -a 127.0.0.1 -p 19522 -js -sd "$W/js" >/dev/null 2>&1 &
wait_http http://127.0.0.1:19500/

declare -A PID
ingress() { # name port [env...]
  local name=$1 port=$2; shift 2
  cat > "$W/$name.yaml" <<YAML
listen: 127.0.0.1:$port
admin_listen: 127.0.0.1:$((port + 1000))
upstream: http://127.0.0.1:19500
data_dir: $W/data-$name
nats: { url: nats://127.0.0.1:19522 }
queues:
  - { name: deferred-$name, rate: 100/s, max_depth: 100000000 }
rules:
  - { name: all, match: { methods: [GET] }, key: [const:all], algorithm: token_bucket, limit: 1, period: 1h }
  - { name: orders, match: { methods: [POST], path: /api/orders }, action: enqueue, queue: deferred-$name }
YAML
  env "$@" "$W/ingress" -config "$W/$name.yaml" 2>"$W/$name.log" &
  PID[$name]=$!
  wait_ready "http://127.0.0.1:$((port + 1000))/readyz"
  wait_http "http://127.0.0.1:$port/x" # spends the one request the limit allows
}
ingress floor 19501
ingress nofloor 19502 GOGC=100
curl -si http://127.0.0.1:19501/x > "$W/429.txt"
"$W/replay" -listen 127.0.0.1:19510 -response "$W/429.txt" &
PID[eight]=$!
"$W/replay" -listen 127.0.0.1:19511 -response "$W/429.txt" -set "Content-Length: $(curl -s http://127.0.0.1:19501/x | wc -c); Cache-Control: no-store" &
PID[ten]=$!
wait_http http://127.0.0.1:19510/x
wait_http http://127.0.0.1:19511/x

cat > "$W/post.lua" <<'LUA'
wrk.method = "POST"
wrk.body = '{"order":"0123456789","items":[1,2,3],"note":"benchmark payload.."}'
wrk.headers["Content-Type"] = "application/json"
LUA
ticks() { awk '{print $14 + $15}' "/proc/$1/stat"; }
declare -A RPS CPU
wrk_run() { # key pid url [script]
  local key=$1 pid=$2 url=$3 script=(); [ -n "${4:-}" ] && script=(-s "$4")
  local t0 t1 out rps; t0=$(ticks "$pid")
  out=$(wrk -t2 -c64 -d"${DUR}s" "${script[@]}" "$url")
  t1=$(ticks "$pid")
  rps=$(awk '/Requests\/sec/ {print $2}' <<<"$out")
  RPS[$key]="${RPS[$key]:-} $rps"
  CPU[$key]="${CPU[$key]:-} $(awk -v t=$((t1 - t0)) -v hz="$(getconf CLK_TCK)" -v r="$rps" -v d="$DUR" 'BEGIN {printf "%.1f", t / hz * 1e6 / (r * d)}')"
}
runs=("429-floor ${PID[floor]} http://127.0.0.1:19501/x"
  "429-nofloor ${PID[nofloor]} http://127.0.0.1:19502/x"
  "defer-floor ${PID[floor]} http://127.0.0.1:19501/api/orders $W/post.lua"
  "defer-nofloor ${PID[nofloor]} http://127.0.0.1:19502/api/orders $W/post.lua"
  "replay-8-entries ${PID[eight]} http://127.0.0.1:19510/x"
  "replay-10-entries ${PID[ten]} http://127.0.0.1:19511/x")
for _ in $(seq 1 "$ROUNDS"); do
  for r in "${runs[@]}"; do
    # shellcheck disable=SC2086
    wrk_run $r
  done
done

median() { tr ' ' '\n' | grep . | sort -g | awk '{a[NR]=$1} END {print (NR%2 ? a[(NR+1)/2] : (a[NR/2]+a[NR/2+1])/2)}'; }
echo "# $(date -u +%F) $(nproc) cores, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs), $(go version | cut -d' ' -f3), commit $(git rev-parse --short HEAD)"
echo "# wrk -t2 -c64 -d${DUR}s, $ROUNDS interleaved rounds: req/s per round and median; server CPU µs per request, median"
echo
echo '| run | req/s per round | median | CPU µs/req |'
echo '|---|---|---:|---:|'
for r in "${runs[@]}"; do
  k=${r%% *}
  printf '| %s | %s | %.0f | %s |\n' "$k" "${RPS[$k]# }" "$(median <<<"${RPS[$k]}")" "$(median <<<"${CPU[$k]}")"
done
ratio() { awk -v a="$(median <<<"${RPS[$1]}")" -v b="$(median <<<"${RPS[$2]}")" 'BEGIN {printf "%.2f", a/b}'; }
cpu() { awk -v a="$(median <<<"${CPU[$1]}")" -v b="$(median <<<"${CPU[$2]}")" 'BEGIN {printf "%.2f", a/b}'; }
echo
echo "with ÷ without, req/s (CPU per request): GC floor on the 429 $(ratio 429-floor 429-nofloor) ($(cpu 429-floor 429-nofloor)), on the defer path $(ratio defer-floor defer-nofloor) ($(cpu defer-floor defer-nofloor)); eight header entries ÷ ten $(ratio replay-8-entries replay-10-entries) ($(cpu replay-8-entries replay-10-entries))"
echo
echo "# envelope: go test -run '^\$' -bench Decode -count 5 ./queue/"
go test -run '^$' -bench Decode -benchmem -count 5 ./queue/ | grep -E '^Benchmark'
echo
echo "# dialahead: go test -run '^\$' -bench DialAhead -benchtime 1x -count 3 ./internal/worker/"
go test -run '^$' -bench DialAhead -benchtime 1x -count 3 ./internal/worker/ | grep -E '^Benchmark'
