#!/usr/bin/env bash
# What a fleet-scoped quota costs a request (issue 58): one cutover (one
# data-plane worker) in front of nginx `return 200` (its own process), with
# a `redis-server` (its own process, a unix socket) as `[limits] store`.
# Three routes on one listener, asked in alternating rounds by
# `wrk -t1 -c16 --latency` for SECONDS each:
#
#   /open      no quota
#   /fleet     `scope = "fleet"`, the default pre-allowance (10 % of the
#              limit per round trip), a limit above what one worker
#              serves, so every request is admitted and pays the decision
#   /fleet1pc  the same with `pre_allowance = 0.01` (ten times the round
#              trips: a lease of 10 ms, refilled at half)
#
# Prints per round and route: req/s, the gateway's CPU per request (the
# scheduler's run time of every thread of its process / requests
# answered), Redis's CPU per request, p99 latency at saturation; then the
# same route paced below saturation (each connection waits 1 ms between
# requests, wrk's `delay()`: about a quarter of what one worker serves),
# where p99 is the request's own time rather than the queue's; then the
# medians' ratios against /open and the p99 each quota adds, both ways.
#
#   benches/fleet_limit.sh [CUTOVER_BINARY] [ROUNDS] [SECONDS]
#
# Needs wrk, nginx-light, redis-server, python3, curl. Loopback only; every
# process it starts is stopped by pid.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
bin=${1:-$here/../target/release/cutover}
rounds=${2:-4}
seconds=${3:-8}
for tool in wrk nginx redis-server python3 curl; do
  command -v "$tool" > /dev/null || { echo "needs $tool (apt-get install wrk nginx-light redis-server python3 curl)"; exit 1; }
done
dir=$(mktemp -d)
. "$here/one_route.sh"
gateway=
redis=
cleanup() {
  [ -n "$redis" ] && kill "$redis" 2>/dev/null || true
  one_route_cleanup "$dir"
  sleep 0.3
  rm -rf "$dir"
}
trap cleanup EXIT

back=$(start_backend "$dir")
redis-server --port 0 --unixsocket "$dir/redis.sock" --save "" --appendonly no \
  --dir "$dir" > "$dir/redis.out" 2>&1 &
redis=$!

port=$(free_port); admin=$(free_port); metrics=$(free_port)
cat > "$dir/gw.toml" <<CFG
[admin]
bind = "127.0.0.1:$admin"
[metrics]
bind = "127.0.0.1:$metrics"
[log]
level = "warn"
[runtime]
worker_threads = 1
[limits]
store = { redis = { url = "unix://$dir/redis.sock" } }
[[listeners]]
name = "web"
bind = "127.0.0.1:$port"
[[routes]]
name = "open"
listeners = ["web"]
path_prefix = "/open"
upstream = "app"
[[routes]]
name = "fleet"
listeners = ["web"]
path_prefix = "/fleet/"
upstream = "app"
quota = { rate = 200000, per = "1s", scope = "fleet" }
[[routes]]
name = "fleet1pc"
listeners = ["web"]
path_prefix = "/fleet1pc/"
upstream = "app"
quota = { rate = 200000, per = "1s", scope = "fleet", pre_allowance = 0.01 }
[upstreams.app]
backends = [{ addr = "127.0.0.1:$back" }]
CFG
"$bin" run -c "$dir/gw.toml" > "$dir/gw.out" 2> "$dir/gw.err" &
gateway=$!
for _ in $(seq 1 200); do
  curl -s -o /dev/null "http://127.0.0.1:$port/open" && break
  sleep 0.05
done
# The store is up once a fleet route is decided by it, not by the
# fallback: wait for the first `allowed` decision in the fleet scope.
up=
for _ in $(seq 1 200); do
  curl -s -o /dev/null "http://127.0.0.1:$port/fleet/x"
  if curl -s "http://127.0.0.1:$metrics/metrics" \
    | grep '^cutover_ratelimit_decisions_total' | grep 'outcome="allowed"' \
    | grep -q 'scope="fleet"'; then
    up=1; break
  fi
  sleep 0.05
done
[ -n "$up" ] || { echo "the store never decided a request:"; cat "$dir/gw.err" "$dir/redis.out"; exit 1; }

targets=("open /open" "fleet /fleet/x" "fleet1pc /fleet1pc/x")
# p99 from wrk's --latency table, in ms.
p99_ms() {
  awk '$1 == "99%" { v = $2; if (v ~ /us$/) { sub(/us$/, "", v); print v / 1000 }
    else if (v ~ /ms$/) { sub(/ms$/, "", v); print v }
    else if (v ~ /s$/) { sub(/s$/, "", v); print v * 1000 } }'
}

# One unmeasured pass over each route first (connections, leases).
for t in "${targets[@]}"; do
  wrk -t1 -c16 -d2s "http://127.0.0.1:$port${t#* }" > /dev/null
done

printf 'function delay()\n  return 1\nend\n' > "$dir/pace.lua"

declare -A rps cpu rcpu p99 paced
for round in $(seq 1 "$rounds"); do
  for t in "${targets[@]}"; do
    name=${t%% *}; path=${t#* }
    before=$(run_ns "$gateway"); rbefore=$(run_ns "$redis")
    out=$(wrk -t1 -c16 -d"${seconds}s" --latency "http://127.0.0.1:$port$path")
    after=$(run_ns "$gateway"); rafter=$(run_ns "$redis")
    requests=$(echo "$out" | awk '/requests in/ {print $1}')
    if echo "$out" | grep -q "Non-2xx"; then
      echo "$name: answers other than 2xx (the limit was reached?):"; echo "$out"; exit 1
    fi
    r=$(echo "$out" | awk '/Requests\/sec/ {print $2}')
    c=$(python3 -c "print(round(($after - $before) / 1000 / $requests, 3))")
    rc=$(python3 -c "print(round(($rafter - $rbefore) / 1000 / $requests, 3))")
    p=$(echo "$out" | p99_ms)
    slow=$(wrk -t1 -c16 -d"${seconds}s" --latency -s "$dir/pace.lua" "http://127.0.0.1:$port$path")
    if echo "$slow" | grep -q "Non-2xx"; then
      echo "$name paced: answers other than 2xx:"; echo "$slow"; exit 1
    fi
    sp=$(echo "$slow" | p99_ms); sr=$(echo "$slow" | awk '/Requests\/sec/ {print $2}')
    echo "round $round: $name $r req/s, CPU $c µs/request (redis $rc), p99 $p ms; paced $sr req/s, p99 $sp ms"
    rps[$name]="${rps[$name]:-} $r"; cpu[$name]="${cpu[$name]:-} $c"
    rcpu[$name]="${rcpu[$name]:-} $rc"; p99[$name]="${p99[$name]:-} $p"; paced[$name]="${paced[$name]:-} $sp"
  done
done
median() { python3 -c "import statistics,sys; print(statistics.median(float(x) for x in sys.argv[1:]))" "$@"; }
# shellcheck disable=SC2086
base_cpu=$(median ${cpu[open]}); base_rps=$(median ${rps[open]}); base_p99=$(median ${p99[open]})
# shellcheck disable=SC2086
base_paced=$(median ${paced[open]})
for t in "${targets[@]:1}"; do
  name=${t%% *}
  # shellcheck disable=SC2086
  c=$(median ${cpu[$name]}); r=$(median ${rps[$name]}); p=$(median ${p99[$name]}); rc=$(median ${rcpu[$name]})
  # shellcheck disable=SC2086
  sp=$(median ${paced[$name]})
  python3 -c "print(f'$name / open: CPU per request {$c / $base_cpu:.3f}, throughput {$r / $base_rps:.3f}, p99 added {$p - $base_p99:+.3f} ms at saturation, {$sp - $base_paced:+.3f} ms paced ({$sp} vs {$base_paced}), redis {$rc} µs/request (medians of $rounds rounds)')"
done
decisions=$(curl -s "http://127.0.0.1:$metrics/metrics" | grep '^cutover_ratelimit_decisions_total' || true)
echo "decisions:"; echo "$decisions"
