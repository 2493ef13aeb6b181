#!/usr/bin/env bash
# The defer path at two commits and beside the bare publishers, in one run on this machine,
# loopback only (docs/design/queue.md, "The defer path: what a deferral costs").
#
# Each side's ingress has a nats-server of its own (file store): an ingress that receives the
# holds' deliveries (before issue 44's change) would otherwise receive the other side's too.
# Beside them, on the before side's server, scripts/jspub as the ceilings:
#   jsperjob  one store per request (a subject and a Nats-Msg-Id per job): issue 44's yardstick
#   jst1      one admission ticket, then the job: a direct submission's stores
#   jst2      two tickets together, then the job: a rule's deferral's stores (the queue's ledger
#             and the rule's deferral budget), without anything else Sluice does
# Per run (wrk -t2 -c64 -s post.lua, DUR seconds; ROUNDS rounds, who goes first alternating; a
# queue of its own per round): req/s, the server's and its nats-server's CPU per request (from
# /proc), and the messages nats-server received and sent per request (from /varz).
#
# Usage: scripts/bench-defer.sh BEFORE [AFTER] [seconds per run] [rounds]
# BEFORE and AFTER are commits (AFTER defaults to the work tree as it is).
set -euo pipefail
cd "$(dirname "$0")/.."
BEFORE=${1:?usage: scripts/bench-defer.sh BEFORE [AFTER] [seconds] [rounds]}
AFTER=${2:-}
DUR=${3:-5}
ROUNDS=${4:-3}
W=$(mktemp -d)
cleanup() {
  set +e
  kill $(jobs -p) 2>/dev/null; wait 2>/dev/null
  git worktree remove --force "$W/src-a" 2>/dev/null; git worktree remove --force "$W/src-b" 2>/dev/null
  rm -rf "$W"; true
}
trap cleanup EXIT
command -v wrk >/dev/null || { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq wrk >/dev/null; }

build() { # side rev
  local src=.
  if [ -n "$2" ]; then git worktree add -q --detach "$W/src-$1" "$2"; src="$W/src-$1"; fi
  (cd "$src" && go build -o "$W/ingress-$1" ./cmd/ingress)
}
build a "$BEFORE"
build b "$AFTER"
go build -o "$W/nats-server" github.com/nats-io/nats-server/v2
go build -o "$W/jspub" ./scripts/jspub

declare -A NPORT=([a]=19822 [b]=19823) MPORT=([a]=18822 [b]=18823) HTTP=([a]=19802 [b]=19803) NPID IPID
for s in a b; do
  "$W/nats-server" -a 127.0.0.1 -p "${NPORT[$s]}" -m "${MPORT[$s]}" -js -sd "$W/js-$s" >/dev/null 2>&1 &
  NPID[$s]=$!
done
sleep 0.5
declare -A PPORT=([jsperjob]=19830 [jst1]=19831 [jst2]=19832) PPID_
"$W/jspub" -listen 127.0.0.1:19830 -nats "nats://127.0.0.1:${NPORT[a]}" -per-job & PPID_[jsperjob]=$!
"$W/jspub" -listen 127.0.0.1:19831 -nats "nats://127.0.0.1:${NPORT[a]}" -tickets 1 & PPID_[jst1]=$!
"$W/jspub" -listen 127.0.0.1:19832 -nats "nats://127.0.0.1:${NPORT[a]}" -tickets 2 & PPID_[jst2]=$!

# max_waiting_per_key: every request here has the same key; a budget of 1 000 (the default)
# would answer 429 after the first 1 000 deferrals.
for s in a b; do
  {
    echo "listen: 127.0.0.1:${HTTP[$s]}"
    echo "admin_listen: 127.0.0.1:$((${HTTP[$s]} + 1000))"
    echo "upstream: http://127.0.0.1:9"
    echo "data_dir: $W/data-$s"
    echo "nats: { url: nats://127.0.0.1:${NPORT[$s]} }"
    echo "shutdown_timeout: 1s"
    echo "queues:"
    for r in $(seq 1 "$ROUNDS"); do echo "  - { name: deferred-$r, rate: 100/s, max_depth: 100000000 }"; done
    echo "rules:"
    for r in $(seq 1 "$ROUNDS"); do
      echo "  - { name: orders-$r, match: { methods: [POST], path: /api/orders/$r }, action: enqueue, queue: deferred-$r, max_waiting_per_key: 100000000 }"
    done
  } > "$W/$s.yaml"
  "$W/ingress-$s" -config "$W/$s.yaml" 2>"$W/$s.log" &
  IPID[$s]=$!
done
for s in a b; do
  for _ in $(seq 1 400); do curl -sf -o /dev/null "http://127.0.0.1:$((${HTTP[$s]} + 1000))/readyz" && break; sleep 0.05; done
done
for p in 19830 19831 19832; do for _ in $(seq 1 200); do curl -s -o /dev/null "http://127.0.0.1:$p/" && break; sleep 0.05; done; done

cat > "$W/post.lua" <<'LUA'
wrk.method = "POST"
wrk.body = '{"order":"0123456789","items":[1,2,3],"note":"benchmark payload.."}'
wrk.headers["Content-Type"] = "application/json"
LUA
ticks() { awk '{print $14+$15}' "/proc/$1/stat"; }
varz() { curl -s "http://127.0.0.1:$1/varz" | tr ',' '\n' | awk -F: '/"in_msgs"/ {i=$2} /"out_msgs"/ {o=$2} END {print i+0, o+0}'; }
declare -A R
run() { # name url server-pid nats-pid monitor-port
  local s0 n0 s1 n1 i0 o0 i1 o1 out rps reqs non
  s0=$(ticks "$3"); n0=$(ticks "$4"); read -r i0 o0 <<<"$(varz "$5")"
  out=$(wrk -t2 -c64 -d"${DUR}s" -s "$W/post.lua" "$2")
  s1=$(ticks "$3"); n1=$(ticks "$4"); read -r i1 o1 <<<"$(varz "$5")"
  rps=$(awk '/Requests\/sec/ {print $2}' <<<"$out"); reqs=$(awk '/requests in/ {print $1}' <<<"$out")
  non=$(awk '/Non-2xx/ {print $NF}' <<<"$out")
  R[$1]="${R[$1]:-} $rps"
  awk -v n="$1" -v r="$rps" -v q="$reqs" -v s=$((s1 - s0)) -v nn=$((n1 - n0)) -v di=$((i1 - i0)) -v dout=$((o1 - o0)) -v e="${non:-0}" 'BEGIN {
    printf "| %s | %.0f | %.1f | %.1f | %.2f | %.2f | %s |\n", n, r, s * 1e4 / q, nn * 1e4 / q, di / q, dout / q, e }'
}
echo "# $(date -u +%F) $(nproc) cores, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs), $(go version | cut -d' ' -f3)"
echo "# before (a): $(git rev-parse --short "$BEFORE"), after (b): ${AFTER:-the work tree at $(git rev-parse --short HEAD)}; wrk -t2 -c64 -d${DUR}s"
echo
echo '| run | req/s | server CPU µs/req | nats-server CPU µs/req | nats msgs in/req | out/req | non-2xx |'
echo '|---|---:|---:|---:|---:|---:|---:|'
for r in $(seq 1 "$ROUNDS"); do
  echo "| *round $r, $(date -u +%T), load $(cut -d' ' -f1 /proc/loadavg)* | | | | | | |"
  order="a b"; [ $((r % 2)) = 0 ] && order="b a"
  for s in $order; do run "defer-$s" "http://127.0.0.1:${HTTP[$s]}/api/orders/$r" "${IPID[$s]}" "${NPID[$s]}" "${MPORT[$s]}"; done
  for p in jsperjob jst1 jst2; do run "$p" "http://127.0.0.1:${PPORT[$p]}/x" "${PPID_[$p]}" "${NPID[a]}" "${MPORT[a]}"; done
done
median() { tr ' ' '\n' | grep . | sort -g | awk '{a[NR]=$1} END {print (NR%2 ? a[(NR+1)/2] : (a[NR/2]+a[NR/2+1])/2)}'; }
m() { median <<<"${R[$1]}"; }
echo
echo '| ratio of medians | before (a) | after (b) |'
echo '|---|---:|---:|'
for p in jsperjob jst1 jst2; do
  printf '| defer ÷ %s | %.2f | %.2f |\n' "$p" "$(awk -v x="$(m defer-a)" -v y="$(m $p)" 'BEGIN {print x/y}')" "$(awk -v x="$(m defer-b)" -v y="$(m $p)" 'BEGIN {print x/y}')"
done
printf '| after ÷ before | | %.2f |\n' "$(awk -v x="$(m defer-b)" -v y="$(m defer-a)" 'BEGIN {print x/y}')"
printf '| jst2 ÷ jsperjob (the ceiling of three stores) | %.2f | |\n' "$(awk -v x="$(m jst2)" -v y="$(m jsperjob)" 'BEGIN {print x/y}')"
