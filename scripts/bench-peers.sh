#!/usr/bin/env bash
# Sluice beside its peers, in one run on this machine, loopback only (BENCHMARKS.md, "Peers").
#
# HTTP (wrk -t2 -c64, ROUNDS interleaved rounds of DUR seconds per server):
#   plain        a Go net/http "ok" server (examples/upstream -ok): the upstream of the proxies
#   same429      a Go net/http server answering the bytes of the ingress's 429 (scripts/replay)
#   defer path   Sluice ingress, action: enqueue: POST → JetStream (nats-server process, file
#                store) → PubAck → 202. Beside it, scripts/jspub: a net/http server that only
#                publishes the body and answers 202 after the PubAck, to one subject (jspub) and
#                to a subject and Nats-Msg-Id per message as Sluice does (jsperjob): the ceiling
#                of any such server on this machine; and jspub -tickets 2 (jsticket2): two
#                admission tickets stored together before each job, the stores of a rule's
#                deferral, the ceiling of exact admission as built (docs/design/queue.md)
#   429 path     Sluice ingress (memory; Redis, answered from its cache of rejections),
#                nginx limit_req, HAProxy stick table: every request over a spent limit
#   forward path Sluice ingress (memory limiter, a limit never reached), Go's
#                httputil.ReverseProxy (scripts/goproxy), nginx limit_req, HAProxy stick table,
#                Caddy reverse_proxy: every request proxied to the plain server
# Drain (4 worker processes of concurrency 16 each, one redis-server, a recording upstream):
#   Sluice workers (JetStream + Redis leak schedule) and BullMQ workers, unthrottled and at
#   200/s (BullMQ's limiter {max: 200, duration: 1000}); achieved rate and the largest number
#   of deliveries in any one-second window, from the arrival times at the upstream. Beside them,
#   4 scripts/jsdrain processes: JetStream's ceiling for a worker that delivers over HTTP, and
#   for one that also records each job's outcome in the status bucket (-record), as Sluice does.
#   Then DRAIN_ROUNDS rounds (default 3) of the figures issue 44 sets for the drain, each from
#   its own backlog: Sluice unthrottled with its workers settled (the queue paused until all
#   four are ready) and from their start (the start window inside the measure), both against
#   jsdrain -record in the same round (the mean of its drains before and after them); the workers' CPU per job (from /proc) at rate 2000/s
#   against the settled unthrottled drain's; and a fair queue whose FAIR_JOBS jobs (default
#   10 000) belong to one tenant each against the same queue with one tenant. The defer path's
#   ratio to the bare publisher with a subject and id per job is the HTTP part's "sdefer ÷
#   jsperjob". The drains' queues are plain ones (but the fair ones): with SHARED unset they
#   take the config's default, 16 shared streams; SHARED=S runs them with
#   nats.shared_streams: S, SHARED=0 with a stream per queue (the jsdrain processes follow the
#   config either way). NAME_SALT=x changes the rounds' queue names (so their shared streams).
#
# Installs what it lacks: wrk nginx haproxy caddy redis-server (apt), bullmq (npm, into
# scripts/peers). Usage: scripts/bench-peers.sh [seconds per HTTP run] [rounds] [jobs]
set -euo pipefail
cd "$(dirname "$0")/.."
DUR=${1:-5}
ROUNDS=${2:-2}   # 0: the drains only
JOBS=${3:-20000}
PACED_JOBS=3000
DRAIN_ROUNDS=${DRAIN_ROUNDS:-3}
FAIR_JOBS=${FAIR_JOBS:-10000}
W=$(mktemp -d)
trap 'kill $(jobs -p) 2>/dev/null; wait 2>/dev/null; rm -rf "$W"' EXIT

need=()
for c in wrk nginx haproxy caddy redis-server; do command -v "$c" >/dev/null || need+=("$c"); done
if [ ${#need[@]} -gt 0 ]; then
  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${need[@]}" >/dev/null
fi
# npm 11 refuses `npm ci` when the lock lacks the platform packages of an optional dependency
# that its registry does not serve (msgpackr-extract's, here); `npm install` takes the lock's
# versions all the same.
[ -d scripts/peers/node_modules/bullmq ] && [ -d scripts/peers/node_modules/ioredis ] ||
  (cd scripts/peers && { npm ci --no-audit --no-fund --silent 2>/dev/null || npm install --no-save --no-audit --no-fund --silent; })

go build -o "$W/ingress" ./cmd/ingress
go build -o "$W/worker" ./cmd/worker
go build -o "$W/plain" ./examples/upstream
go build -o "$W/goproxy" ./scripts/goproxy
go build -o "$W/replay" ./scripts/replay
go build -o "$W/load" ./cmd/load
go build -o "$W/jsdrain" ./scripts/jsdrain
go build -o "$W/jspub" ./scripts/jspub
go build -o "$W/recorder" ./cmd/worker/testdata/upstream
go build -o "$W/nats-server" github.com/nats-io/nats-server/v2

wait_http() { for _ in $(seq 1 200); do curl -s -o /dev/null "$1" && return 0; sleep 0.05; done; echo "no answer from $1" >&2; exit 1; }
# wait_ready <url>: until it answers 2xx (an ingress opens its queues after its listeners)
wait_ready() { for _ in $(seq 1 400); do curl -sf -o /dev/null "$1" && return 0; sleep 0.05; done; echo "not ready: $1" >&2; exit 1; }

# ---- servers -----------------------------------------------------------------------------
"$W/plain" -ok -listen 127.0.0.1:19100 2>/dev/null &
redis-server --port 19379 --bind 127.0.0.1 --save '' --appendonly no --loglevel warning >/dev/null &
"$W/nats-server" -a 127.0.0.1 -p 19422 -js -sd "$W/js" >/dev/null 2>&1 &
wait_http http://127.0.0.1:19100/

# max_waiting_per_key: a rule's deferral budget is at most 1 000 of one key's jobs by default,
# and every request here has the same key; without it the defer rounds measured the budget's
# 429 after the first 1 000 deferrals.
sluice() { # name listen store limit
  local redis=""; [ "$3" = redis ] && redis="redis: { url: redis://127.0.0.1:19379/0 }"
  cat > "$W/$1.yaml" <<YAML
listen: $2
admin_listen: 127.0.0.1:$((${2##*:} + 1000))
upstream: http://127.0.0.1:19100
data_dir: $W/data-$1
nats: { url: nats://127.0.0.1:19422 }
$redis
queues:
  - { name: deferred-$1, rate: 100/s, max_depth: 100000000 }
rules:
  - { name: all, match: { methods: [GET] }, key: [const:all], algorithm: token_bucket, limit: $4, period: 1h }
  - { name: orders, match: { methods: [POST], path: /api/orders }, action: enqueue, queue: deferred-$1, max_waiting_per_key: 100000000 }
YAML
  "$W/ingress" -config "$W/$1.yaml" 2>"$W/$1.log" &
  wait_ready "http://127.0.0.1:$((${2##*:} + 1000))/readyz"
}
sluice mem429 127.0.0.1:19201 mem 1
sluice red429 127.0.0.1:19203 redis 1
sluice memfwd 127.0.0.1:19202 mem 1000000000000
"$W/goproxy" -listen 127.0.0.1:19310 -upstream http://127.0.0.1:19100 &
"$W/jspub" -listen 127.0.0.1:19330 -nats nats://127.0.0.1:19422 &
"$W/jspub" -listen 127.0.0.1:19331 -nats nats://127.0.0.1:19422 -per-job &
"$W/jspub" -listen 127.0.0.1:19332 -nats nats://127.0.0.1:19422 -tickets 2 &

mkdir -p "$W/nginx"
cat > "$W/nginx.conf" <<CONF
user root;
worker_processes 2;
pid $W/nginx/pid;
error_log $W/nginx/error.log error;
events { worker_connections 4096; }
http {
  access_log off;
  client_body_temp_path $W/nginx; proxy_temp_path $W/nginx; fastcgi_temp_path $W/nginx;
  uwsgi_temp_path $W/nginx; scgi_temp_path $W/nginx;
  limit_req_zone \$server_name zone=spent:1m rate=1r/m;
  limit_req_zone \$server_name zone=open:1m rate=100000000r/s;
  limit_req_status 429;
  upstream plain { server 127.0.0.1:19100; keepalive 64; }
  server { listen 127.0.0.1:19301; server_name n429;
    location / { limit_req zone=spent nodelay; return 200 "ok"; } }
  server { listen 127.0.0.1:19302; server_name nfwd;
    location / { limit_req zone=open burst=100000000 nodelay; proxy_http_version 1.1;
      proxy_set_header Connection ""; proxy_pass http://plain; } }
}
CONF
nginx -c "$W/nginx.conf" -g 'daemon off;' &

cat > "$W/haproxy.cfg" <<CONF
global
  nbthread 2
defaults
  mode http
  timeout connect 5s
  timeout client 30s
  timeout server 30s
backend counts
  stick-table type integer size 16 expire 1h store http_req_rate(1h)
backend plain
  http-reuse always
  server p 127.0.0.1:19100
frontend h429
  bind 127.0.0.1:19305
  http-request track-sc0 int(1) table counts
  http-request deny deny_status 429 if { sc_http_req_rate(0) gt 1 }
  http-request return status 200 content-type text/plain string ok
frontend hfwd
  bind 127.0.0.1:19306
  http-request track-sc0 int(2) table counts
  http-request deny deny_status 429 if { sc_http_req_rate(0) gt 1000000000000 }
  default_backend plain
CONF
haproxy -db -f "$W/haproxy.cfg" >/dev/null 2>&1 &

cat > "$W/Caddyfile" <<CONF
{
  admin off
  auto_https off
}
http://127.0.0.1:19307 {
  reverse_proxy 127.0.0.1:19100
}
CONF
caddy run --config "$W/Caddyfile" --adapter caddyfile >/dev/null 2>&1 &

# Wait for every server; on the 429 paths, that first request spends the one the limit allows.
for p in 19201 19203 19301 19305 19202 19302 19306 19307 19310 19330 19331 19332; do wait_http "http://127.0.0.1:$p/x"; done
# The plain server again, answering with the memory ingress's 429 as recorded: what net/http
# costs for the same bytes (headers and body) without a decision.
curl -si http://127.0.0.1:19201/x > "$W/429.txt"
"$W/replay" -listen 127.0.0.1:19320 -response "$W/429.txt" &
wait_http http://127.0.0.1:19320/x

# ---- HTTP ----------------------------------------------------------------------------------
cat > "$W/post.lua" <<'LUA'
wrk.method = "POST"
wrk.body = '{"order":"0123456789","items":[1,2,3],"note":"benchmark payload.."}'
wrk.headers["Content-Type"] = "application/json"
LUA
declare -A RPS P99
wrk_run() { # key url
  local script=(); [[ $1 == *defer* || $1 == js* ]] && script=(-s "$W/post.lua")
  local out; out=$(wrk -t2 -c64 -d"${DUR}s" --latency "${script[@]}" "$2")
  if [[ $1 == *defer* ]] && ! grep -q "Non-2xx" <<<"$out"; then :; elif [[ $1 == *defer* ]]; then echo "$1: non-2xx answers" >&2; fi
  local rps p99; rps=$(awk '/Requests\/sec/ {print $2}' <<<"$out"); p99=$(awk '$1=="99%" {print $2}' <<<"$out")
  RPS[$1]="${RPS[$1]:-} $rps"; P99[$1]="${P99[$1]:-} $p99"
}
runs=(plain:http://127.0.0.1:19100/x
  same429:http://127.0.0.1:19320/x s429mem:http://127.0.0.1:19201/x s429redis:http://127.0.0.1:19203/x n429:http://127.0.0.1:19301/x h429:http://127.0.0.1:19305/x
  sdefer:http://127.0.0.1:19202/api/orders jspub:http://127.0.0.1:19330/x jsperjob:http://127.0.0.1:19331/x jsticket2:http://127.0.0.1:19332/x
  sfwd:http://127.0.0.1:19202/x gofwd:http://127.0.0.1:19310/x nfwd:http://127.0.0.1:19302/x hfwd:http://127.0.0.1:19306/x cfwd:http://127.0.0.1:19307/x)
for _ in $(seq 1 "$ROUNDS"); do
  for r in "${runs[@]}"; do wrk_run "${r%%:*}" "${r#*:}"; done
done

median() { tr ' ' '\n' | grep . | sort -g | awk '{a[NR]=$1} END {print (NR%2 ? a[(NR+1)/2] : (a[NR/2]+a[NR/2+1])/2)}'; }
echo "# $(date -u +%F) $(nproc) cores, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs), $(go version | cut -d' ' -f3)"
echo "# nginx $(nginx -v 2>&1 | cut -d/ -f2), $(haproxy -v | head -1 | cut -d' ' -f1-3), caddy $(caddy version | cut -d' ' -f1), bullmq $(node -p 'require("./scripts/peers/node_modules/bullmq/package.json").version'), redis $(redis-server --version | cut -d' ' -f3)"
if [ "$ROUNDS" -gt 0 ]; then
echo "# wrk -t2 -c64 -d${DUR}s, $ROUNDS interleaved rounds; req/s of each round, median, and ratio to the plain server's median"
echo
echo '| run | req/s per round | median | ÷ plain | p99 per round |'
echo '|---|---|---:|---:|---|'
base=$(median <<<"${RPS[plain]}")
for r in "${runs[@]}"; do
  k=${r%%:*}; m=$(median <<<"${RPS[$k]}")
  printf '| %s | %s | %.0f | %.2f | %s |\n' "$k" "${RPS[$k]# }" "$m" "$(awk -v a="$m" -v b="$base" 'BEGIN {print a/b}')" "${P99[$k]# }"
done
echo
ratio() { awk -v a="$(median <<<"${RPS[$1]}")" -v b="$(median <<<"${RPS[$2]}")" 'BEGIN {printf "%.2f", a/b}'; }
echo "sdefer ÷ jspub $(ratio sdefer jspub), ÷ jsperjob $(ratio sdefer jsperjob), ÷ jsticket2 $(ratio sdefer jsticket2) (jsticket2 ÷ jsperjob $(ratio jsticket2 jsperjob)); s429mem ÷ same429 $(ratio s429mem same429); sfwd ÷ gofwd $(ratio sfwd gofwd)"
fi

# ---- drain ---------------------------------------------------------------------------------
# The arrivals are written beside, not among, the configs: a worker watches its config's
# directory, and a write per delivery there woke it for every job (3% of its CPU).
mkdir -p "$W/rec"
"$W/recorder" > "$W/rec/arrivals" &
for _ in $(seq 1 100); do [ -s "$W/rec/arrivals" ] && break; sleep 0.05; done
REC=$(head -1 "$W/rec/arrivals")

# stats <uri> <jobs>: waits for the jobs to arrive, then prints "rate/s max-in-1s seconds"
stats() {
  for _ in $(seq 1 3000); do
    [ "$(grep -c " $1 " "$W/rec/arrivals" || true)" -ge "$2" ] && break; sleep 0.1
  done
  grep " $1 " "$W/rec/arrivals" | awk '{print $1}' | sort -n | awk '
    { t[NR] = $1 }
    END { j = 1; best = 0
      for (i = 1; i <= NR; i++) { while (j <= NR && t[j] - t[i] < 1e9) j++; if (j - i > best) best = j - i }
      span = (t[NR] - t[1]) / 1e9; printf "%.1f %d %.2f\n", (NR - 1) / span, best, span }'
}

# The drains' queues: one of each kind per round, so that each drain counts its own arrivals.
# The ingress has them all; each drain's workers only the queue they drain.
cat > "$W/drain-head.yaml" <<YAML
listen: 127.0.0.1:19401
admin_listen: 127.0.0.1:20401
upstream: http://127.0.0.1:19100
nats: { url: nats://127.0.0.1:19422${SHARED:+, shared_streams: $SHARED} }
redis: { url: redis://127.0.0.1:19379/0 }
shutdown_timeout: 1s
queues:
YAML
declare -A QLINE
qline() { # name rate target [more]
  QLINE[$1]="  - { name: $1, rate: $2, concurrency: 16, max_depth: 10000000, ${4:+$4, }target: \"POST $REC/$3/$1\" }"
}
# NAME_SALT=x names the rounds' queues settledx1, freshx1, ...: other names, so other shared
# streams (FNV-1a of the name), for the same rounds.
S=${NAME_SALT:-}
qline paced 200/s sluice
for r in $(seq 1 "$DRAIN_ROUNDS"); do
  qline "settled$S$r" 1000000/s sluice; qline "fresh$S$r" 1000000/s sluice; qline "throttled$S$r" 2000/s sluice
  qline "fairone$S$r" 1000000/s sluice 'tenant: "header:X-Tenant", fair: true'
  qline "fairmany$S$r" 1000000/s sluice 'tenant: "header:X-Tenant", fair: true'
  qline "bare$S$r" 1000000/s bare; qline "bared$S$r" 1000000/s bare; qline "baredb$S$r" 1000000/s bare
done
{ cat "$W/drain-head.yaml"; printf '%s\n' "${QLINE[@]}"; } > "$W/drain.yaml"
"$W/ingress" -config "$W/drain.yaml" 2>"$W/drain-ingress.log" &
wait_ready http://127.0.0.1:20401/readyz
TCK=$(getconf CLK_TCK)
cpu_ticks() { local t=0; for p in "$@"; do t=$((t + $(awk '{print $14 + $15}' "/proc/$p/stat"))); done; echo "$t"; }
fill() { # queue jobs [load flags]: the backlog, through the ingress
  local q=$1 n=$2; shift 2
  "$W/load" -url "http://127.0.0.1:19401/v1/queues/$q/jobs" -method POST -body x -c 32 -n "$n" -warmup 0 -d 10m "$@" >/dev/null
}
sluice_drain() { # queue jobs [fresh]
  # Four worker processes on a backlog filled before they start. Settled (the default): the
  # queue is paused until every worker is ready, so the drain is measured without processes
  # starting up beside it. fresh: the workers start straight onto the backlog, their start
  # window inside the measure. Prints "rate/s max-in-1s seconds workers'-CPU-µs-per-job".
  local pids=()
  [ "${3:-}" = fresh ] || curl -s -o /dev/null -X POST "http://127.0.0.1:20401/v1/queues/$1/pause"
  for i in 1 2 3 4; do
    { sed "s/admin_listen: .*/admin_listen: 127.0.0.1:$((20410 + i))/" "$W/drain-head.yaml"; echo "${QLINE[$1]}"; } > "$W/worker$i.yaml"
    "$W/worker" -config "$W/worker$i.yaml" 2>"$W/worker$i.log" & pids+=($!)
  done
  if [ "${3:-}" != fresh ]; then
    for i in 1 2 3 4; do
      for _ in $(seq 1 200); do [ "$(curl -s -o /dev/null -w '%{http_code}' "http://127.0.0.1:$((20410 + i))/readyz")" = 200 ] && break; sleep 0.05; done
    done
  fi
  local c0; c0=$(cpu_ticks "${pids[@]}")
  [ "${3:-}" = fresh ] || curl -s -o /dev/null -X POST "http://127.0.0.1:20401/v1/queues/$1/resume"
  local s; s=$(stats "/sluice/$1" "$2")
  local c1; c1=$(cpu_ticks "${pids[@]}")
  echo "$s $(awk -v d=$((c1 - c0)) -v t="$TCK" -v n="$2" 'BEGIN {printf "%.0f", d / t * 1e6 / n}')"
  kill "${pids[@]}"; wait "${pids[@]}" 2>/dev/null || true
}
bare_drain() { # queue jobs [-record]
  # The JetStream ceiling: 4 scripts/jsdrain processes fetch, POST and ack, nothing else (with
  # -record, they also record each job's outcome in the status bucket, as Sluice's workers do).
  local q=$1 pids=()
  for i in 1 2 3 4; do
    "$W/jsdrain" -config "$W/drain.yaml" -queue "$q" -target "$REC/bare/$q" -c 16 ${3:-} > "$W/jsdrain$i.out" 2>"$W/jsdrain$i.log" & pids+=($!)
  done
  for i in 1 2 3 4; do
    for _ in $(seq 1 200); do grep -q ready "$W/jsdrain$i.out" && break; sleep 0.05; done
  done
  kill -USR1 "${pids[@]}"
  stats "/bare/$q" "$2"
  kill "${pids[@]}"; wait "${pids[@]}" 2>/dev/null || true
}
bull_drain() { # name jobs max
  node scripts/peers/bullmq.mjs produce 19379 "$1" "$2"
  local pids=()
  for _ in 1 2 3 4; do node scripts/peers/bullmq.mjs work 19379 "$1" "$REC/bull/$1" 16 "$3" & pids+=($!); done
  node scripts/peers/bullmq.mjs resume 19379 "$1" 4
  stats "/bull/$1" "$2"
  kill "${pids[@]}"; wait "${pids[@]}" 2>/dev/null || true
}
row() { printf '| %s | %s |\n' "$1" "$(sed 's/ / | /g' <<<"$2")"; }
div() { awk -v a="$1" -v b="$2" 'BEGIN {printf "%.2f", a / b}'; }

echo
echo "# drain: 4 worker processes × concurrency 16, one redis-server; $JOBS jobs unthrottled, $PACED_JOBS at 200/s, $DRAIN_ROUNDS rounds, shared_streams: ${SHARED:-unset (default 16)}"
echo
echo '| drain | achieved jobs/s | most in any 1 s | seconds | workers'"'"' CPU µs/job |'
echo '|---|---:|---:|---:|---:|'
declare -A R
for r in $(seq 1 "$DRAIN_ROUNDS"); do
  # The recording consumer drains before and after Sluice's two unthrottled drains, and their
  # mean is the round's baseline: the machine's speed drifts within a round (jsdrain -record
  # alone ran at 8 253–13 407 jobs/s across the rounds of one quiet run), and a baseline on one
  # side of the drains it divides moved their ratios with that drift.
  fill "bared$S$r" "$JOBS"; out=$(bare_drain "bared$S$r" "$JOBS" -record); row "$r: bare JetStream, fetch, POST, record, ack (jsdrain -record), before" "$out -"; set -- $out; rec=$1
  fill "settled$S$r" "$JOBS"; out=$(sluice_drain "settled$S$r" "$JOBS"); row "$r: Sluice, unthrottled, settled" "$out"; set -- $out; R[settled]+=" $1"; cpu_un=$4
  fill "fresh$S$r" "$JOBS"; out=$(sluice_drain "fresh$S$r" "$JOBS" fresh); row "$r: Sluice, unthrottled, from the workers' start" "$out"; set -- $out; fresh=$1
  fill "baredb$S$r" "$JOBS"; out=$(bare_drain "baredb$S$r" "$JOBS" -record); row "$r: bare JetStream, fetch, POST, record, ack (jsdrain -record), after" "$out -"; set -- $out
  rec=$(awk -v a="$rec" -v b="$1" 'BEGIN {print (a + b) / 2}')
  R[fresh]+=" $(div "$fresh" "$rec")"; R[settledr]+=" $(div "${R[settled]##* }" "$rec")"
  fill "throttled$S$r" "$JOBS"; out=$(sluice_drain "throttled$S$r" "$JOBS"); row "$r: Sluice, rate 2000/s" "$out"; set -- $out; R[cpu]+=" $(div "$4" "$cpu_un")"
  fill "fairone$S$r" "$FAIR_JOBS" -header "X-Tenant: t0"; out=$(sluice_drain "fairone$S$r" "$FAIR_JOBS"); row "$r: Sluice, fair, 1 tenant" "$out"; set -- $out; one=$1
  fill "fairmany$S$r" "$FAIR_JOBS" -unique-header X-Tenant; out=$(sluice_drain "fairmany$S$r" "$FAIR_JOBS"); row "$r: Sluice, fair, $FAIR_JOBS tenants of one job" "$out"; set -- $out; R[fair]+=" $(div "$1" "$one")"
done
printf '| BullMQ, unthrottled | %s | - |\n' "$(bull_drain unthrottled "$JOBS" 0 | sed 's/ / | /g')"
fill "bare${S}1" "$JOBS"
printf '| bare JetStream: fetch, POST, ack (scripts/jsdrain) | %s | - |\n' "$(bare_drain "bare${S}1" "$JOBS" | sed 's/ / | /g')"
fill paced "$PACED_JOBS"
printf '| Sluice, rate 200/s | %s |\n' "$(sluice_drain paced "$PACED_JOBS" | sed 's/ / | /g')"
printf '| BullMQ, limiter 200/s | %s | - |\n' "$(bull_drain paced "$PACED_JOBS" 200 | sed 's/ / | /g')"

minof() { tr ' ' '\n' <<<"$1" | grep . | sort -g | head -1; }
echo
echo "# the drain's ratios (issue 44, item 5), per round"
echo
echo '| ratio | rounds | median | least | target |'
echo '|---|---|---:|---:|---|'
for k in "fresh:Sluice unthrottled from the workers' start ÷ jsdrain -record:≥ 0.9 every round" \
         "settledr:Sluice unthrottled, settled ÷ jsdrain -record:≥ 0.9" \
         "cpu:workers' CPU per job at 2 000/s ÷ unthrottled:≤ 1.5" \
         "fair:fair queue, $FAIR_JOBS tenants ÷ 1 tenant:≥ 0.8"; do
  IFS=: read -r key name target <<<"$k"
  printf '| %s | %s | %s | %s | %s |\n' "$name" "${R[$key]# }" "$(median <<<"${R[$key]}")" "$(minof "${R[$key]}")" "$target"
done
[ -z "${KEEP_ARRIVALS:-}" ] || cp "$W/rec/arrivals" "$KEEP_ARRIVALS"   # for a closer look at the drains
