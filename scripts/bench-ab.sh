#!/usr/bin/env bash
# Sluice at two commits, side by side in one run on this machine, loopback only: the numbers a
# change is judged by (BENCHMARKS.md, "Before and after"), interleaved so that both see the
# same machine.
#
#   429      the memory 429 path of an ingress (wrk -t2 -c64)
#   defer    the defer path: POST → JetStream (nats-server process, file store) → 202, beside
#            scripts/jspub -per-job (the bare publisher, a subject and a Nats-Msg-Id per job):
#            the ratio to it is printed for both sides
#   drain    4 worker processes × concurrency 16 empty an unthrottled backlog of JOBS jobs, and
#            PACED jobs at 200/s: achieved jobs/s and the most deliveries in any one second,
#            from the arrival times at a recording upstream
#
# Usage: scripts/bench-ab.sh BEFORE [AFTER] [seconds per HTTP run] [rounds] [jobs]
# BEFORE and AFTER are commits (AFTER defaults to the work tree as it is); jobs 0 skips the
# drains.
set -euo pipefail
cd "$(dirname "$0")/.."
BEFORE=${1:?usage: scripts/bench-ab.sh BEFORE [AFTER] [seconds] [rounds] [jobs]}
AFTER=${2:-}
DUR=${3:-5}
ROUNDS=${4:-3}
JOBS=${5:-20000}
PACED=2000
W=$(mktemp -d)
cleanup() {
  set +e
  kill $(jobs -p) 2>/dev/null; wait 2>/dev/null
  git worktree remove --force "$W/src-a" 2>/dev/null; git worktree remove --force "$W/src-b" 2>/dev/null
  rm -rf "$W"; true
}
trap cleanup EXIT
need=()
for c in wrk redis-server; do command -v "$c" >/dev/null || need+=("$c"); done
if [ ${#need[@]} -gt 0 ]; then
  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${need[@]}" >/dev/null
fi

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
go build -o "$W/jspub" ./scripts/jspub

wait_http() { for _ in $(seq 1 200); do curl -s -o /dev/null "$1" && return 0; sleep 0.05; done; echo "no answer from $1" >&2; exit 1; }
# wait_ready <url>: until it answers 2xx (an ingress opens its queues after its listeners)
wait_ready() { for _ in $(seq 1 400); do curl -sf -o /dev/null "$1" && return 0; sleep 0.05; done; echo "not ready: $1" >&2; exit 1; }
"$W/plain" -ok -listen 127.0.0.1:19600 2>/dev/null &
redis-server --port 19679 --bind 127.0.0.1 --save '' --appendonly no --loglevel warning >/dev/null &
"$W/nats-server" -a 127.0.0.1 -p 19622 -js -sd "$W/js" >/dev/null 2>&1 &
wait_http http://127.0.0.1:19600/
"$W/jspub" -listen 127.0.0.1:19630 -nats nats://127.0.0.1:19622 -per-job &
# The arrivals are written beside, not among, the configs: a worker watches its config's
# directory, and a write per delivery there woke it for every job (3% of its CPU).
mkdir -p "$W/rec"
"$W/recorder" > "$W/rec/arrivals" &
for _ in $(seq 1 100); do [ -s "$W/rec/arrivals" ] && break; sleep 0.05; done
REC=$(head -1 "$W/rec/arrivals")

# max_waiting_per_key: a rule's deferral budget is at most 1 000 of one key's jobs by default,
# and every request here has the same key; without it the defer runs measured the budget's 429
# after the first 1 000 deferrals. A commit before the key had no budget and refuses the key.
config() { # side port
  local mw=", max_waiting_per_key: 100000000"
  [ "$1" = a ] && ! git grep -q max_waiting_per_key "$BEFORE" -- internal/config && mw=""
  cat <<YAML
listen: 127.0.0.1:$2
admin_listen: 127.0.0.1:$(($2 + 1000))
upstream: http://127.0.0.1:19600
data_dir: $W/data-$1
nats: { url: nats://127.0.0.1:19622 }
redis: { url: redis://127.0.0.1:19679/0 }
shutdown_timeout: 1s
queues:
$(for r in $(seq 1 "$ROUNDS"); do echo "  - { name: deferred-$1-$r, rate: 100/s, max_depth: 100000000 }"; done)
  - { name: unthrottled-$1, rate: 1000000/s, concurrency: 16, max_depth: 10000000, target: "POST $REC/$1/unthrottled" }
  - { name: paced-$1, rate: 200/s, concurrency: 16, max_depth: 10000000, target: "POST $REC/$1/paced" }
rules:
  - { name: all, match: { methods: [GET] }, key: [const:all], algorithm: token_bucket, limit: 1, period: 1h }
$(for r in $(seq 1 "$ROUNDS"); do echo "  - { name: orders-$r, match: { methods: [POST], path: /api/orders/$r }, action: enqueue, queue: deferred-$1-$r$mw }"; done)
YAML
}
# The 429 ingresses keep their limiter in memory: a config without redis.
config a 19601 | grep -v '^redis:' > "$W/http-a.yaml"
config b 19602 | grep -v '^redis:' > "$W/http-b.yaml"
config a 19611 > "$W/drain-a.yaml"
config b 19612 > "$W/drain-b.yaml"
for s in a b; do "$W/ingress-$s" -config "$W/http-$s.yaml" 2>"$W/http-$s.log" & done
for s in a b; do "$W/ingress-$s" -config "$W/drain-$s.yaml" 2>"$W/drain-$s.log" & done
for p in 20601 20602 20611 20612; do wait_ready "http://127.0.0.1:$p/readyz"; done
for p in 19601 19602; do wait_http "http://127.0.0.1:$p/x"; done # spends the one request allowed

cat > "$W/post.lua" <<'LUA'
wrk.method = "POST"
wrk.body = '{"order":"0123456789","items":[1,2,3],"note":"benchmark payload.."}'
wrk.headers["Content-Type"] = "application/json"
LUA
declare -A R
add() { R[$1]="${R[$1]:-} $2"; }
wrk_run() { # key url [script]
  local script=(); [ -n "${3:-}" ] && script=(-s "$3")
  add "$1" "$(wrk -t2 -c64 -d"${DUR}s" "${script[@]}" "$2" | awk '/Requests\/sec/ {print $2}')"
}
stats() { # uri jobs total → "rate max-in-1s" of the last jobs arrivals, once total have come
  for _ in $(seq 1 3000); do
    [ "$(grep -c " $1 " "$W/rec/arrivals" || true)" -ge "$3" ] && break; sleep 0.1
  done
  grep " $1 " "$W/rec/arrivals" | awk '{print $1}' | sort -n | tail -n "$2" | awk '
    { t[NR] = $1 }
    END { j = 1; best = 0
      for (i = 1; i <= NR; i++) { while (j <= NR && t[j] - t[i] < 1e9) j++; if (j - i > best) best = j - i }
      printf "%.1f %d\n", (NR - 1) / ((t[NR] - t[1]) / 1e9), best }'
}
declare -A HTTP=([a]=19601 [b]=19602) DRAIN=([a]=19611 [b]=19612) SENT
drain() { # side queue jobs
  local port=${DRAIN[$1]} pids=() key="$1-$2"
  local admin=$((port + 1000))
  SENT[$key]=$(( ${SENT[$key]:-0} + $3 ))
  "$W/load" -url "http://127.0.0.1:$port/v1/queues/$2-$1/jobs" -method POST -body x -c 32 -n "$3" -warmup 0 -d 10m >/dev/null
  curl -s -o /dev/null -X POST "http://127.0.0.1:$admin/v1/queues/$2-$1/pause"
  for i in 1 2 3 4; do
    sed "s/admin_listen: .*/admin_listen: 127.0.0.1:$((20620 + i))/" "$W/drain-$1.yaml" > "$W/worker-$1-$i.yaml"
    "$W/worker-$1" -config "$W/worker-$1-$i.yaml" 2>"$W/worker-$1-$i.log" & pids+=($!)
  done
  for i in 1 2 3 4; do
    for _ in $(seq 1 200); do [ "$(curl -s -o /dev/null -w '%{http_code}' "http://127.0.0.1:$((20620 + i))/readyz")" = 200 ] && break; sleep 0.05; done
  done
  curl -s -o /dev/null -X POST "http://127.0.0.1:$admin/v1/queues/$2-$1/resume"
  local out; out=$(stats "/$1/$2" "$3" "${SENT[$key]}")
  kill "${pids[@]}"; wait "${pids[@]}" 2>/dev/null || true
  echo "$out"
}
for round in $(seq 1 "$ROUNDS"); do
  # Each round swaps who goes first, so that neither side always runs after the other.
  order="a b"; [ $((round % 2)) = 0 ] && order="b a"
  for s in $order; do wrk_run "429-$s" "http://127.0.0.1:${HTTP[$s]}/x"; done
  # A queue of its own each round: a round's deferrals never meet a queue an earlier one
  # filled (max_bytes, 256 MiB by default since this round).
  for s in $order; do wrk_run "defer-$s" "http://127.0.0.1:${HTTP[$s]}/api/orders/$round" "$W/post.lua"; done
  wrk_run jsperjob http://127.0.0.1:19630/ "$W/post.lua"
  [ "$JOBS" -gt 0 ] || continue
  for s in $order; do
    drain "$s" unthrottled "$JOBS" > "$W/out"; read -r rate most < "$W/out"; add "drain-$s" "$rate"; add "drainmax-$s" "$most"
    drain "$s" paced "$PACED" > "$W/out"; read -r rate most < "$W/out"; add "paced-$s" "$rate"; add "pacedmax-$s" "$most"
  done
done

median() { tr ' ' '\n' | grep . | sort -g | awk '{a[NR]=$1} END {print (NR%2 ? a[(NR+1)/2] : (a[NR/2]+a[NR/2+1])/2)}'; }
echo "# $(date -u +%F) $(nproc) cores, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs), $(go version | cut -d' ' -f3)"
echo "# before: $(git rev-parse --short "$BEFORE"), after: ${AFTER:-the work tree at $(git rev-parse --short HEAD)}; $ROUNDS interleaved rounds, who goes first alternating"
echo "# HTTP: wrk -t2 -c64 -d${DUR}s; drain: 4 workers × concurrency 16, $JOBS jobs unthrottled, $PACED at 200/s"
echo
echo '| measure | before, per round | after, per round | after ÷ before (medians) |'
echo '|---|---|---|---:|'
printf '| jsperjob (bare publisher) | %s | %s | |\n' "${R[jsperjob]# }" "${R[jsperjob]# }"
printf '| defer ÷ jsperjob (medians) | %.2f | %.2f | |\n' \
  "$(awk -v a="$(median <<<"${R[defer-a]}")" -v b="$(median <<<"${R[jsperjob]}")" 'BEGIN {print a/b}')" \
  "$(awk -v a="$(median <<<"${R[defer-b]}")" -v b="$(median <<<"${R[jsperjob]}")" 'BEGIN {print a/b}')"
for k in 429 defer drain paced drainmax pacedmax; do
  [ -n "${R[$k-a]:-}" ] || continue
  printf '| %s | %s | %s | %.2f |\n' "$k" "${R[$k-a]# }" "${R[$k-b]# }" \
    "$(awk -v a="$(median <<<"${R[$k-a]}")" -v b="$(median <<<"${R[$k-b]}")" 'BEGIN {print b/a}')"
done
