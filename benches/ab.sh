#!/usr/bin/env bash
# A/B: the same keep-alive load through two cutover binaries, side by side
# in front of nginx answering `return 200` from one worker (its own
# process, next to nothing per request), alternating between them so that
# a neighbour weighs on both alike. Prints requests/s and the proxy's CPU
# per request (utime + stime / requests) per round, then the means and
# the ratio B / A.
#
#   benches/ab.sh OLD_BINARY NEW_BINARY [ROUNDS] [SECONDS]
#
# e.g. build the previous commit in a worktree, then
#   benches/ab.sh /tmp/old/target/release/cutover target/release/cutover 6 5
# AB_B_UPSTREAM adds lines to side B's upstream only: the same binary with
# and without a feature, e.g.
#   AB_B_UPSTREAM='health = { path = "/", interval = "1s" }' \
#     benches/ab.sh target/release/cutover target/release/cutover
# AB_B_ROUTE does the same for side B's route, and AB_PATH is the path
# requested (default /): the route filters' cost, e.g.
#   AB_PATH=/api/orders/7 AB_B_ROUTE='rewrite = { strip_prefix = "/api" }
#   request_id = true' benches/ab.sh target/release/cutover target/release/cutover
# Installs wrk and nginx-light from Debian's packages when missing.
# Loopback only; every process it starts is stopped by pid on exit.
set -euo pipefail
a_bin=${1:?usage: benches/ab.sh A_BINARY B_BINARY [ROUNDS] [SECONDS]}
b_bin=${2:?usage: benches/ab.sh A_BINARY B_BINARY [ROUNDS] [SECONDS]}
rounds=${3:-6}
seconds=${4:-5}

need=()
command -v wrk >/dev/null || need+=(wrk)
command -v nginx >/dev/null || need+=(nginx-light)
if [ ${#need[@]} -gt 0 ]; then
  apt-get update -qq && apt-get install -y -qq "${need[@]}" >/dev/null
fi

work=$(mktemp -d)
pids=()
cleanup() {
  for pid in "${pids[@]}"; do kill "$pid" 2>/dev/null || true; done
  [ -f "$work/nginx.pid" ] && kill "$(cat "$work/nginx.pid")" 2>/dev/null || true
  rm -rf "$work"
}
trap cleanup EXIT

free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
backend=$(free_port)
cat > "$work/nginx.conf" <<CONF
worker_processes 1;
pid $work/nginx.pid;
error_log $work/nginx.err;
events { worker_connections 4096; }
http {
  access_log off;
  keepalive_requests 1000000;
  server { listen 127.0.0.1:$backend; location / { return 200 "ok"; } }
}
CONF
nginx -c "$work/nginx.conf"

start() { # NAME BINARY UPSTREAM_EXTRA ROUTE_EXTRA -> "pid port"
  local port admin
  port=$(free_port); admin=$(free_port)
  cat > "$work/$1.toml" <<CONF
[admin]
bind = "127.0.0.1:$admin"
[log]
level = "warn"
[[listeners]]
name = "web"
bind = "127.0.0.1:$port"
[[routes]]
name = "all"
listeners = ["web"]
upstream = "app"
$4
[upstreams.app]
backends = [{ addr = "127.0.0.1:$backend" }]
$3
CONF
  "$2" run -c "$work/$1.toml" >"$work/$1.log" 2>&1 &
  echo "$! $port"
}
read -r a_pid a_port < <(start a "$a_bin" "" ""); pids+=("$a_pid")
read -r b_pid b_port < <(start b "$b_bin" "${AB_B_UPSTREAM:-}" "${AB_B_ROUTE:-}"); pids+=("$b_pid")
path=${AB_PATH:-/}
for port in "$a_port" "$b_port"; do
  for _ in $(seq 100); do curl -s -o /dev/null "http://127.0.0.1:$port/" && break; sleep 0.1; done
done

cpu() { awk '{print $14 + $15}' "/proc/$1/stat"; }
# The order alternates: odd rounds A then B, even rounds B then A. Run
# always second, B read 2.8–2.9 % less CPU per request than A in two
# sittings of 8 rounds whichever binary it was.
for round in $(seq "$rounds"); do
  order="a b"; [ $((round % 2)) -eq 0 ] && order="b a"
  for side in $order; do
    if [ $side = a ]; then pid=$a_pid; port=$a_port; else pid=$b_pid; port=$b_port; fi
    before=$(cpu "$pid")
    out=$(wrk -t1 -c64 -d"${seconds}s" "http://127.0.0.1:$port$path")
    after=$(cpu "$pid")
    rps=$(awk '/Requests\/sec/ {print $2}' <<<"$out")
    total=$(awk '/requests in/ {print $1}' <<<"$out")
    ticks=$(getconf CLK_TCK)
    echo "$out" | grep -q "Non-2xx" && echo "round $round $side: non-2xx answers" >&2
    awk -v r="$round" -v s="$side" -v rps="$rps" -v t="$total" -v c=$((after - before)) -v hz="$ticks" \
      'BEGIN { printf "round %d %s rps=%.0f cpu_us_per_req=%.2f\n", r, s, rps, c * 1e6 / hz / t }'
  done
done | tee "$work/rounds"
awk '{ split($4, r, "="); split($5, c, "="); n[$3]++; rps[$3] += r[2]; cpu[$3] += c[2] }
     END { printf "A: %.0f req/s, %.2f us/req\nB: %.0f req/s, %.2f us/req\nB / A: throughput %.3f, CPU per request %.3f\n",
           rps["a"]/n["a"], cpu["a"]/n["a"], rps["b"]/n["b"], cpu["b"]/n["b"],
           (rps["b"]/n["b"]) / (rps["a"]/n["a"]), (cpu["b"]/n["b"]) / (cpu["a"]/n["a"]) }' "$work/rounds"
