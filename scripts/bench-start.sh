#!/usr/bin/env bash
# A fresh worker's start window, worker by worker (docs/design/start-window.md; issue 44
# item 5). Each drain: JOBS jobs stored through an ingress while no
# worker runs, then 4 worker processes of concurrency 16 started one after another onto them,
# as scripts/bench-peers.sh starts them:
#
#   fresh    the workers start straight onto the backlog (bench-peers' "from the workers'
#            start"): the clock starts at the first arrival at the upstream
#   settled  the queue is paused until all four answer /readyz 200, then resumed
#
# Each worker's config gives the queue its own target path (/<run>/w<i>), so the recording
# upstream's arrival lines tell the workers apart. Per worker: launched and ready (ms after the
# first launch; ready from the worker's "worker: draining" log line, ms resolution), its first
# arrival after its own launch and after the first arrival overall, its ramp (deliveries in
# the 100 ms after its own first arrival ÷ its mean per 100 ms) and its deliveries in each
# 100 ms of the first second after the first arrival overall. Per drain: the rate ((jobs - 1)
# ÷ first-to-last arrival), the late workers' lag (Σ own first arrival − first overall, ÷ 4),
# the longest gap between two arrivals and the attempt that ended it (a job stranded until its
# ack_wait shows as a gap of ~30 s), the jobs delivered twice, and the workers' and
# nats-server's CPU (settled: also from exec to ready). Then fresh ÷ settled per round and the
# medians.
#
# With BEFORE (a commit), its worker binary and the work tree's alternate, round by round, on
# the same backlog size in one run (the ingress is the work tree's for both). The load
# average is printed at each drain: on a shared machine, read the figures beside it.
#
# Environment: LOG_DIR=dir keeps each worker's log and launch time there; KEEP_ARRIVALS=file
# keeps the upstream's arrival lines (<Unix ns> <job> <attempt> /<drain>/w<i> <status>); MODES
# (default "fresh settled") the drains run in each round.
#
# Usage: scripts/bench-start.sh [rounds] [jobs] [BEFORE]
set -euo pipefail
cd "$(dirname "$0")/.."
ROUNDS=${1:-3}
JOBS=${2:-20000}
BEFORE=${3:-}
W=$(mktemp -d)
MODES=${MODES:-fresh settled}
cleanup() {
  set +e
  [ -z "${KEEP_ARRIVALS:-}" ] || cp "$W/rec/arrivals" "$KEEP_ARRIVALS"
  kill $(jobs -p) 2>/dev/null; wait 2>/dev/null
  [ -z "$BEFORE" ] || git worktree remove --force "$W/src-before" 2>/dev/null
  rm -rf "$W"; true
}
trap cleanup EXIT
command -v redis-server >/dev/null ||
  { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq redis-server >/dev/null; }

go build -o "$W/ingress" ./cmd/ingress
go build -o "$W/worker-tree" ./cmd/worker
go build -o "$W/load" ./cmd/load
go build -o "$W/recorder" ./cmd/worker/testdata/upstream
go build -o "$W/nats-server" github.com/nats-io/nats-server/v2
SIDES=(tree)
if [ -n "$BEFORE" ]; then
  git worktree add -q --detach "$W/src-before" "$BEFORE"
  (cd "$W/src-before" && go build -o "$W/worker-before" ./cmd/worker)
  SIDES=(before tree)
fi

wait_ready() { for _ in $(seq 1 400); do curl -sf -o /dev/null "$1" && return 0; sleep 0.05; done; echo "not ready: $1" >&2; exit 1; }
redis-server --port 19779 --bind 127.0.0.1 --save '' --appendonly no --loglevel warning >/dev/null &
"$W/nats-server" -a 127.0.0.1 -p 19722 -js -sd "$W/js" >/dev/null 2>&1 & NATS_PID=$!

# The recorder writes beside, not among, the configs (a worker watches its config's directory).
mkdir -p "$W/rec" "$W/cfg"
"$W/recorder" > "$W/rec/arrivals" &
for _ in $(seq 1 100); do [ -s "$W/rec/arrivals" ] && break; sleep 0.05; done
REC=$(head -1 "$W/rec/arrivals")

cat > "$W/cfg/head.yaml" <<YAML
listen: 127.0.0.1:19701
admin_listen: 127.0.0.1:20701
upstream: http://127.0.0.1:1
nats: { url: nats://127.0.0.1:19722 }
redis: { url: redis://127.0.0.1:19779/0 }
shutdown_timeout: 1s
queues:
YAML
qline() { # name target
  echo "  - { name: $1, rate: 1000000/s, concurrency: 16, max_depth: 10000000, target: \"POST $2\" }"
}
NAMES=()
for r in $(seq 1 "$ROUNDS"); do
  for s in "${SIDES[@]}"; do for mode in $MODES; do NAMES+=("$mode-$s-$r"); done; done
done
{ cat "$W/cfg/head.yaml"; for n in "${NAMES[@]}"; do qline "$n" "$REC/$n"; done; } > "$W/cfg/ingress.yaml"
"$W/ingress" -config "$W/cfg/ingress.yaml" 2>"$W/ingress.log" &
wait_ready http://127.0.0.1:20701/readyz

# fill <queue> <jobs>: the backlog, through the ingress; STORED is how many it holds (under load
# the ingress may answer a few posts 503: the drain then waits for the jobs stored, not JOBS)
fill() {
  "$W/load" -url "http://127.0.0.1:19701/v1/queues/$1/jobs" -method POST -body x -c 32 -n "$2" -warmup 0 -d 10m >/dev/null
  STORED=$(curl -s "http://127.0.0.1:20701/v1/queues/$1" | sed -n 's/.*"depth":\([0-9]*\).*/\1/p')
  [ "${STORED:-0}" -eq "$2" ] || echo "note: $1 holds ${STORED:-?} of the $2 jobs posted" >&2
}
# cpu_ms <pid>...: their CPU time so far, user and system, in ms
cpu_ms() { local t=0; for p in "$@"; do t=$((t + $(awk '{print $14 + $15}' "/proc/$p/stat"))); done; echo $((t * 1000 / $(getconf CLK_TCK))); }
now_ms() { echo "${EPOCHREALTIME/./}" | cut -c1-13; }
# log_ms <file> <message>: the Unix ms of the worker's first log line with that message
log_ms() {
  local t; t=$(grep -m1 "msg=\"$2\"" "$1" | sed -n 's/^time=\([^ ]*\) .*/\1/p')
  [ -n "$t" ] && date -d "$t" +%s%3N || echo 0
}

# drain <side> <name> <fresh|settled>: prints one table row per worker and "rate" to fd 3
drain() {
  local side=$1 q=$2 mode=$3 pids=() launch=()
  [ "$mode" = fresh ] || curl -s -o /dev/null -X POST "http://127.0.0.1:20701/v1/queues/$q/pause"
  for i in 1 2 3 4; do
    { sed "s/admin_listen: .*/admin_listen: 127.0.0.1:$((20710 + i))/" "$W/cfg/head.yaml"; qline "$q" "$REC/$q/w$i"; } > "$W/cfg/w$i.yaml"
  done
  local n0; n0=$(cpu_ms "$NATS_PID")
  for i in 1 2 3 4; do
    launch+=("$(now_ms)")
    if [ -n "${PERF_DIR:-}" ]; then # a CPU profile of each worker from its exec (perf report -i)
      perf record -q -F 1999 -g -o "$PERF_DIR/$q-w$i.data" -- "$W/worker-$side" -config "$W/cfg/w$i.yaml" 2>"$W/w$i.log" & pids+=($!)
    else
      "$W/worker-$side" -config "$W/cfg/w$i.yaml" 2>"$W/w$i.log" & pids+=($!)
    fi
  done
  if [ "$mode" = settled ]; then
    for i in 1 2 3 4; do wait_ready "http://127.0.0.1:$((20710 + i))/readyz"; done
    # The start's own CPU: the four workers' from exec to ready (and a few ms of polling)
    echo "start-cpu $(cpu_ms "${pids[@]}") $(($(cpu_ms "$NATS_PID") - n0))" > "$W/startcpu"
    curl -s -o /dev/null -X POST "http://127.0.0.1:20701/v1/queues/$q/resume"
  fi
  for _ in $(seq 1 3000); do
    [ "$(grep -c " /$q/" "$W/rec/arrivals" || true)" -ge "${STORED:-$JOBS}" ] && break; sleep 0.1
  done
  local wcpu n1
  wcpu=$(cpu_ms $(for p in "${pids[@]}"; do pgrep -P "$p" || echo "$p"; done)); n1=$(cpu_ms "$NATS_PID")
  kill -INT "${pids[@]}"; wait "${pids[@]}" 2>/dev/null || true
  if [ -n "${LOG_DIR:-}" ]; then # the workers' logs, and their launch times (Unix ms)
    for i in 1 2 3 4; do cp "$W/w$i.log" "$LOG_DIR/$q-w$i.log"; echo "${launch[$((i - 1))]}" > "$LOG_DIR/$q-w$i.launch"; done
  fi
  local meta=""
  for i in 1 2 3 4; do
    meta+="${launch[$((i - 1))]} $(log_ms "$W/w$i.log" "worker: draining") "
  done
  echo "cpu $wcpu $((n1 - n0))" > "$W/cpu"
  grep " /$q/" "$W/rec/arrivals" | awk -v meta="$meta" -v run="$q" -v load="$(cut -d' ' -f1 /proc/loadavg)" '
    { t = $1; split($4, p, "/"); w = substr(p[3], 2) + 0; n++
      if (n == 1 || t < t0) t0 = t; if (n == 1 || t > tn) tn = t
      if (!(w in first) || t < first[w]) first[w] = t; arr[w, ++cnt[w]] = t
      if (n > 1 && t - prev > gap) { gap = t - prev; gapjob = $2; gapatt = $3 }; prev = t
      if (seen[$2]++) dup++ }
    END {
      split(meta, m, " "); l0 = m[1]
      span = (tn - t0) / 1e9
      for (w = 1; w <= 4; w++) {
        bins = ""
        for (b = 0; b < 10; b++) c[b] = 0
        for (k = 1; k <= cnt[w]; k++) { d = int((arr[w, k] - t0) / 1e8); if (d < 10) c[d]++ }
        for (b = 0; b < 10; b++) bins = bins (b ? " " : "") c[b]
        ready = m[2 * w] ? m[2 * w] - l0 : -1
        lag += (first[w] - t0) / 4
        early = 0
        for (k = 1; k <= cnt[w]; k++) if (arr[w, k] - first[w] < 1e8) early++
        ramp = early / (cnt[w] / span * 0.1)
        printf "| %s | %s | w%d | %d | %d | %.0f | %.0f | %.2f | %s | %d |\n", run, load, w, m[2 * w - 1] - l0, ready, first[w] / 1e6 - m[2 * w - 1], (first[w] - t0) / 1e6, ramp, bins, cnt[w]
      }
      for (w = 1; w <= 4; w++) for (k = 1; k <= cnt[w]; k++) if (arr[w, k] - t0 < 1e9) s1++
      printf "rate %.1f %.2f %.0f %.3f %.0f %.0f %s %s %d\n", (n - 1) / span, span, (t0 / 1e6 - l0), s1 / ((n - 1) / span), lag / 1e6, gap / 1e6, gapjob, gapatt, dup + 0 > "/dev/fd/3"
    }'
}

echo "# $(date -u '+%F %H:%M') UTC, $(nproc) cores, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs), $(go version | cut -d' ' -f3); $JOBS jobs per drain, 4 workers × concurrency 16, $ROUNDS rounds${BEFORE:+, before = $BEFORE}"
echo
echo "| drain | load | worker | launched ms | ready ms | own first arrival ms after its launch | first arrival ms after the first overall | ramp | deliveries per 100 ms, first 1 s | jobs |"
echo "|---|---:|---|---:|---:|---:|---:|---:|---|---:|"
declare -A RATE RATIO LAG
for r in $(seq 1 "$ROUNDS"); do
  for s in "${SIDES[@]}"; do
    for mode in $MODES; do
      q="$mode-$s-$r"
      fill "$q" "$JOBS"
      drain "$s" "$q" "$mode" 3>"$W/rate"
      read -r _ wcpu ncpu < "$W/cpu"; read -r _ rate span first sec1 lag gap gapjob gapatt dup < "$W/rate"
      RATE[$q]=$rate; LAG[$s-$mode]+=" $lag"
      sc=""; [ "$mode" = fresh ] || { read -r _ a b < "$W/startcpu"; sc=" (of which from exec to ready: workers $a, nats-server $b)"; }
      echo "| $q: whole drain | | | | | $first | | | $rate jobs/s over $span s, the first 1 s at $sec1 of that rate; the longest gap between arrivals $gap ms (before job $gapjob, attempt $gapatt), $dup delivered twice; late workers' lag $lag ms ($(awk -v l="$lag" -v s="$span" 'BEGIN {printf "%.1f", l / 10 / s}')% of the drain); CPU ms: workers $wcpu, nats-server $ncpu$sc | |"
    done
    [ "$MODES" != "fresh settled" ] || RATIO[$s]+=" $(awk -v a="${RATE[fresh-$s-$r]}" -v b="${RATE[settled-$s-$r]}" 'BEGIN {printf "%.3f", a / b}')"
  done
done

median() { tr ' ' '\n' | grep . | sort -g | awk '{a[NR]=$1} END {print (NR%2 ? a[(NR+1)/2] : (a[NR/2]+a[NR/2+1])/2)}'; }
echo
echo "| side | fresh ÷ settled per round | median | fresh jobs/s median | settled jobs/s median | late workers' lag ms, fresh, per round | the same, settled |"
echo "|---|---|---:|---:|---:|---|---|"
for s in "${SIDES[@]}"; do
  f=""; st=""
  for r in $(seq 1 "$ROUNDS"); do f+=" ${RATE[fresh-$s-$r]:-}"; st+=" ${RATE[settled-$s-$r]:-}"; done
  echo "| $s | ${RATIO[$s]:-} | $(median <<<"${RATIO[$s]:-}") | $(median <<<"$f") | $(median <<<"$st") | ${LAG[$s-fresh]:-} | ${LAG[$s-settled]:-} |"
done
echo
echo "load average at the end: $(cut -d' ' -f1-3 /proc/loadavg)"
