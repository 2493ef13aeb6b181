#!/usr/bin/env bash
# The Envoy rate-limit service, side by side in one run on one redis-server, loopback only:
# ShouldRateLimit decisions per second and latency with ghz (github.com/bojand/ghz) against
# Sluice's ingress (rls_listen) and against envoyproxy/ratelimit, both counting in Redis.
#
#   peak   ghz -c CONC for SECONDS, as fast as each answers: decisions/s, p50, p99
#   80%    ghz at 80% of Sluice's own peak rate: Sluice's p99 (Envoy's default timeout is 20 ms)
#
# Every call has two descriptors (remote_address with a value per request, and a nested
# tenant/path pair) under limits no run reaches, so every call is a full decision of both.
#
# Usage: scripts/bench-rls.sh [seconds] [concurrency]
# Needs redis-server and Go; ghz and envoyproxy/ratelimit's service_cmd are installed with
# `go install` into a temporary GOBIN unless GHZ and RATELIMIT name binaries.
set -euo pipefail
cd "$(dirname "$0")/.."
DUR=${1:-10}
CONC=${2:-50}
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

SP=$(port)
cat >"$W/sluice.yaml" <<YAML
listen: 127.0.0.1:$(port)
admin_listen: 127.0.0.1:$(port)
data_dir: $W/data
redis: {url: redis://127.0.0.1:$RP/0}
rls_listen: 127.0.0.1:$SP
rls: {config_dir: $W/sluice-domains}
YAML
"$W/ingress" -config "$W/sluice.yaml" >"$W/sluice.log" 2>&1 &
wait_port "$SP"

EP=$(port)
env -i PATH="$PATH" HOST=127.0.0.1 PORT="$(port)" GRPC_HOST=127.0.0.1 GRPC_PORT="$EP" \
  DEBUG_HOST=127.0.0.1 DEBUG_PORT="$(port)" USE_STATSD=false LOG_LEVEL=warn \
  RUNTIME_ROOT="$W/rl/current" RUNTIME_SUBDIRECTORY=ratelimit RUNTIME_WATCH_ROOT=false \
  REDIS_SOCKET_TYPE=tcp REDIS_URL="127.0.0.1:$RP" \
  "$RATELIMIT" >"$W/ratelimit.log" 2>&1 &
wait_port "$EP"

DATA='{"domain":"bench","descriptors":[{"entries":[{"key":"remote_address","value":"10.{{.RequestNumber}}"}]},{"entries":[{"key":"tenant","value":"t{{.WorkerID}}"},{"key":"path","value":"/v1/orders"}]}]}'
run() { # name port [rps]
  local extra=()
  [ -n "${3:-}" ] && extra=(--rps "$3")
  "$GHZ" --insecure --protoset "$W/rls.protoset" --call envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit \
    -d "$DATA" -c "$CONC" -z "${DUR}s" --connections 4 "${extra[@]}" -O json "127.0.0.1:$2" >"$W/$1.json"
  python3 - "$1" "$W/$1.json" <<'PY'
import json, sys
r = json.load(open(sys.argv[2]))
lat = {d["percentage"]: d["latency"] / 1e6 for d in r.get("latencyDistribution") or []}
codes = r.get("statusCodeDistribution", {})
print(f"{sys.argv[1]:<22} {r['rps']:>9.0f}/s  p50 {lat.get(50, 0):6.2f} ms  p99 {lat.get(99, 0):6.2f} ms  {codes}")
PY
}
echo "ShouldRateLimit, ${DUR}s per run, ghz -c $CONC, one redis-server, $(nproc) cores, $(date -u +%F)"
run sluice-warmup "$SP" >/dev/null
run ratelimit-warmup "$EP" >/dev/null
run sluice "$SP"
run ratelimit "$EP"
PEAK=$(python3 -c "import json; print(int(json.load(open('$W/sluice.json'))['rps']))")
run "sluice-at-80%" "$SP" $((PEAK * 8 / 10))
run "ratelimit-at-same" "$EP" $((PEAK * 8 / 10))
