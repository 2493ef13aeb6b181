#!/usr/bin/env bash
# The Envoy rate-limit service, side by side in one run on one redis-server, loopback only:
# ShouldRateLimit decisions per second and latency with ghz (github.com/bojand/ghz) against
# Sluice's ingress (rls_listen) and against envoyproxy/ratelimit, both counting in Redis.
#
#   peak   ghz -c CONC for SECONDS, as fast as each answers: decisions/s, p50, p99
#   80%    ghz at 80% of Sluice's own peak rate: Sluice's p99 (Envoy's default timeout is 20 ms)
#   CPU/call  the user + system CPU time of the service's process and of redis-server per call
#          during the run (/proc/PID/stat): what the load on a shared machine disturbs least
#
# Every call has two descriptors (remote_address with a value per request, and a nested
# tenant/path pair) under limits no run reaches, so every call is a full decision of both.
#
# On a shared machine one pair says little: ROUNDS=N runs the pair N times, interleaved (Sluice
# then ratelimit in odd rounds, ratelimit then Sluice in even ones, each round with its own 80%
# runs) and ends with the median and the spread of the throughput ratio and of Sluice's p99 at
# 80%, and the load average before and after each round. BEFORE=<an ingress binary> adds a
# third service to each round (e.g. Sluice built from an earlier commit), on the same Redis.
#
# Usage: [ROUNDS=N] [BEFORE=bin] scripts/bench-rls.sh [seconds] [concurrency]
# Needs redis-server and Go; ghz and envoyproxy/ratelimit's service_cmd are installed with
# `go install` into a temporary GOBIN unless GHZ and RATELIMIT name binaries.
set -euo pipefail
cd "$(dirname "$0")/.."
DUR=${1:-10}
CONC=${2:-50}
ROUNDS=${ROUNDS:-1}
BEFORE=${BEFORE:-}
W=$(mktemp -d)
cleanup() {
  set +e
  kill $(jobs -p) 2>/dev/null; wait 2>/dev/null
  rm -rf "$W"; true
}
trap cleanup EXIT
port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
wait_port() { for _ in $(seq 200); do (echo >/dev/tcp/127.0.0.1/$1) 2>/dev/null && return 0; sleep 0.05; done; echo "port $1 never opened" >&2; exit 1; }

GHZ=${GHZ:-}
RATELIMIT=${RATELIMIT:-}
if [ -z "$GHZ" ]; then GOBIN=$W/bin go install github.com/bojand/ghz/cmd/ghz@latest; GHZ=$W/bin/ghz; fi
if [ -z "$RATELIMIT" ]; then GOBIN=$W/bin go install github.com/envoyproxy/ratelimit/src/service_cmd@latest; RATELIMIT=$W/bin/service_cmd; fi
go build -o "$W/ingress" ./cmd/ingress
go run ./scripts/rlsprotoset "$W/rls.protoset"

RP=$(port)
redis-server --port "$RP" --bind 127.0.0.1 --save '' --appendonly no --daemonize no >"$W/redis.log" 2>&1 &
RPID=$!
declare -A PID # service pid by port
wait_port "$RP"

DOMAIN='domain: bench
descriptors:
  - key: remote_address
    rate_limit: {unit: second, requests_per_unit: 1000000000}
  - key: tenant
    descriptors:
      - key: path
        rate_limit: {unit: minute, requests_per_unit: 1000000000}'
mkdir -p "$W/sluice-domains" "$W/rl/current/ratelimit/config"
echo "$DOMAIN" >"$W/sluice-domains/bench.yaml"
echo "$DOMAIN" >"$W/rl/current/ratelimit/config/bench.yaml"

declare -A ADMIN # admin address by ingress name
sluice() { # name binary: starts an ingress serving the rate-limit service; sets SP
  SP=$(port)
  ADMIN[$1]=127.0.0.1:$(port)
  cat >"$W/$1.yaml" <<YAML
listen: 127.0.0.1:$(port)
admin_listen: ${ADMIN[$1]}
data_dir: $W/data-$1
redis: {url: redis://127.0.0.1:$RP/0}
rls_listen: 127.0.0.1:$SP
rls: {config_dir: $W/sluice-domains}
YAML
  "$2" -config "$W/$1.yaml" >"$W/$1.log" 2>&1 &
  PID[$SP]=$!
  wait_port "$SP"
}
sluice sluice "$W/ingress"
if [ -n "$BEFORE" ]; then BP_SP=$SP; sluice before "$BEFORE"; BP=$SP; SP=$BP_SP; fi

EP=$(port)
env -i PATH="$PATH" HOST=127.0.0.1 PORT="$(port)" GRPC_HOST=127.0.0.1 GRPC_PORT="$EP" \
  DEBUG_HOST=127.0.0.1 DEBUG_PORT="$(port)" USE_STATSD=false LOG_LEVEL=warn \
  RUNTIME_ROOT="$W/rl/current" RUNTIME_SUBDIRECTORY=ratelimit RUNTIME_WATCH_ROOT=false \
  REDIS_SOCKET_TYPE=tcp REDIS_URL="127.0.0.1:$RP" \
  "$RATELIMIT" >"$W/ratelimit.log" 2>&1 &
PID[$EP]=$!
wait_port "$EP"

DATA='{"domain":"bench","descriptors":[{"entries":[{"key":"remote_address","value":"10.{{.RequestNumber}}"}]},{"entries":[{"key":"tenant","value":"t{{.WorkerID}}"},{"key":"path","value":"/v1/orders"}]}]}'
ticks() { awk '{print $14 + $15}' "/proc/$1/stat"; } # user + system CPU, in clock ticks
run() { # name port [rps]: also the CPU time per call of the service and of redis-server
  local extra=() s0 r0
  [ -n "${3:-}" ] && extra=(--rps "$3")
  s0=$(ticks "${PID[$2]}") r0=$(ticks "$RPID")
  "$GHZ" --insecure --protoset "$W/rls.protoset" --call envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit \
    -d "$DATA" -c "$CONC" -z "${DUR}s" --connections 4 "${extra[@]}" -O json "127.0.0.1:$2" >"$W/$1.json"
  python3 - "$1" "$W/$1.json" $(($(ticks "${PID[$2]}") - s0)) $(($(ticks "$RPID") - r0)) "$(getconf CLK_TCK)" <<'PY'
import json, sys
r = json.load(open(sys.argv[2]))
lat = {d["percentage"]: d["latency"] / 1e6 for d in r.get("latencyDistribution") or []}
codes = r.get("statusCodeDistribution", {})
svc, rds = (int(t) / int(sys.argv[5]) * 1e6 / max(r["count"], 1) for t in sys.argv[3:5])
print(f"{sys.argv[1]:<22} {r['rps']:>9.0f}/s  p50 {lat.get(50, 0):6.2f} ms  p99 {lat.get(99, 0):6.2f} ms  "
      f"CPU/call: service {svc:5.1f} µs, redis {rds:5.1f} µs  {codes}")
PY
}
load() { cut -d' ' -f1-3 /proc/loadavg; }
echo "ShouldRateLimit, ${DUR}s per run, ghz -c $CONC, one redis-server, $(nproc) cores, $(date -u +%F), $ROUNDS round(s)"
run sluice-warmup "$SP" >/dev/null
run ratelimit-warmup "$EP" >/dev/null
[ -n "$BEFORE" ] && run before-warmup "$BP" >/dev/null
for r in $(seq "$ROUNDS"); do
  echo "round $r: load average $(load)"
  order=(sluice ratelimit)
  [ $((r % 2)) -eq 0 ] && order=(ratelimit sluice)
  [ -n "$BEFORE" ] && order+=(before)
  for s in "${order[@]}"; do
    case $s in sluice) run "sluice-$r" "$SP" ;; ratelimit) run "ratelimit-$r" "$EP" ;; before) run "before-$r" "$BP" ;; esac
  done
  PEAK=$(python3 -c "import json; print(int(json.load(open('$W/sluice-$r.json'))['rps']))")
  run "sluice-at-80%-$r" "$SP" $((PEAK * 8 / 10))
  run "ratelimit-at-same-$r" "$EP" $((PEAK * 8 / 10))
  echo "round $r: load average after $(load)"
done
python3 - "$W" "$ROUNDS" "$BEFORE" <<'PY'
import json, statistics, sys
w, n, before = sys.argv[1], int(sys.argv[2]), sys.argv[3]
def get(name):
    r = json.load(open(f"{w}/{name}.json"))
    lat = {d["percentage"]: d["latency"] / 1e6 for d in r.get("latencyDistribution") or []}
    return r["rps"], lat.get(99, 0)
def line(label, xs, fmt):
    print(f"{label:<34} median {fmt(statistics.median(xs))}  range {fmt(min(xs))}–{fmt(max(xs))}  ({', '.join(fmt(x) for x in xs)})")
rounds = range(1, n + 1)
line("Sluice / ratelimit, calls/s", [get(f"sluice-{r}")[0] / get(f"ratelimit-{r}")[0] for r in rounds], lambda x: f"{x:.2f}×")
if before:
    line("Sluice / before, calls/s", [get(f"sluice-{r}")[0] / get(f"before-{r}")[0] for r in rounds], lambda x: f"{x:.2f}×")
line("Sluice p99 at 80% of its peak", [get(f"sluice-at-80%-{r}")[1] for r in rounds], lambda x: f"{x:.1f} ms")
line("ratelimit p99 at the same rate", [get(f"ratelimit-at-same-{r}")[1] for r in rounds], lambda x: f"{x:.1f} ms")
PY
# A store call over store_timeout (50 ms) is answered by on_store_error, not counted in Redis:
# such answers would flatter Sluice's rate, so they are shown. Abandoned calls are those ghz
# cancelled in flight when each run ended (its connections close): no answer was sent.
for s in "${!ADMIN[@]}"; do
  echo "$s: $(curl -s "http://${ADMIN[$s]}/metrics" | grep -E '^sluice_rls_(store_errors|abandoned|responses)_total' | tr '\n' ' ')"
done
# Redis's own time per command: Sluice's decisions are EVALSHA, envoyproxy/ratelimit's INCRBY
# and EXPIRE (one of each per descriptor).
redis-cli -p "$RP" info commandstats | grep -E 'cmdstat_(evalsha|eval|incrby|expire|time|get|set):' 
