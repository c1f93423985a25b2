#!/usr/bin/env bash
# The cache's hit path against nginx `proxy_cache` and Varnish (issue 57):
# one small object (`max-age=3600`) from nginx `return 200` (its own
# process), stored once, then asked for by `wrk -t1 -c64` for SECONDS in
# ROUNDS alternating rounds through each cache in its own process: cutover
# (one data-plane worker, `routes.cache`), nginx (one worker,
# `proxy_cache`), Varnish (`malloc` storage, its default VCL), after one
# unmeasured 2 s pass over each. Prints
# req/s and CPU per request (the scheduler's run time of every thread of
# the cache's processes / requests answered), and the ratios.
#
#   benches/cache_hit.sh [CUTOVER_BINARY] [ROUNDS] [SECONDS]
#
# NGINX_OPEN_FILE_CACHE=1 tunes nginx with `open_file_cache`.
# Needs wrk, nginx-light, python3; Varnish is measured when `varnishd` is
# installed (apt-get install varnish). Loopback only; every process it
# starts is stopped by pid.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
bin=${1:-$here/../target/release/cutover}
rounds=${2:-3}
seconds=${3:-8}
for tool in wrk nginx python3; do
  command -v "$tool" > /dev/null || { echo "needs $tool (apt-get install wrk nginx-light python3)"; exit 1; }
done
dir=$(mktemp -d)
# nginx's workers (user nobody) write their cache files under it, and
# Varnish reads its VCL as its own user: with mktemp's 0700, nginx could
# store nothing and answered every request from its backend (30-75 µs a
# request in the run that found it).
chmod 755 "$dir"
. "$here/one_route.sh"
gateway=
varnish_pid=
cleanup() {
  [ -n "$varnish_pid" ] && kill "$varnish_pid" 2>/dev/null || true
  kill "$(cat "$dir/cache-nginx.pid" 2>/dev/null)" 2>/dev/null || true
  one_route_cleanup "$dir"
  sleep 0.5
  rm -rf "$dir"
}
trap cleanup EXIT

back=$(free_port)
cat > "$dir/nginx.conf" <<NG
worker_processes 1; pid $dir/nginx.pid; error_log $dir/nginx.err;
events {}
http { access_log off; keepalive_requests 10000000;
  server { listen 127.0.0.1:$back; location / { add_header Cache-Control "max-age=3600"; return 200 "hello, cached world\n"; } } }
NG
nginx -c "$dir/nginx.conf" -e "$dir/nginx.err"

nginx_port=$(free_port)
# NGINX_OPEN_FILE_CACHE=1: nginx keeps its cache files open (a common
# production setting) instead of opening each on every hit.
open_file_cache=
if [ -n "${NGINX_OPEN_FILE_CACHE:-}" ]; then
  open_file_cache="open_file_cache max=1000 inactive=60s; open_file_cache_valid 60s;"
fi
cat > "$dir/cache-nginx.conf" <<NG
worker_processes 1; pid $dir/cache-nginx.pid; error_log $dir/cache-nginx.err;
events { worker_connections 4096; }
http { access_log off; keepalive_requests 10000000;
  $open_file_cache
  proxy_cache_path $dir/nc levels=1:2 keys_zone=z:10m max_size=64m;
  upstream app { server 127.0.0.1:$back; keepalive 32; }
  server { listen 127.0.0.1:$nginx_port;
    location / { proxy_pass http://app; proxy_http_version 1.1; proxy_set_header Connection ""; proxy_cache z; proxy_cache_valid 200 1h; } } }
NG
nginx -c "$dir/cache-nginx.conf" -e "$dir/cache-nginx.err"

port=$(free_port); admin=$(free_port)
write_gateway_config "$dir/gw.toml" "$admin" "$port" "$back"
sed -i 's/^upstream = "app"$/upstream = "app"\ncache = { zone = "main" }/' "$dir/gw.toml"
printf '[cache.zones.main]\nmemory = "64MiB"\n' >> "$dir/gw.toml"
"$bin" run -c "$dir/gw.toml" > "$dir/gw.out" 2> "$dir/gw.err" &
gateway=$!

targets=("cutover 127.0.0.1:$port" "nginx 127.0.0.1:$nginx_port")
if command -v varnishd > /dev/null; then
  varnish_port=$(free_port)
  printf 'vcl 4.1;\nbackend app { .host = "127.0.0.1"; .port = "%s"; }\n' "$back" > "$dir/v.vcl"
  chmod 644 "$dir/v.vcl"
  varnishd -a "127.0.0.1:$varnish_port" -f "$dir/v.vcl" -s malloc,64m -n "$dir/varnish" -P "$dir/varnish.pid" -T 127.0.0.1:0 > /dev/null
  varnish_pid=$(cat "$dir/varnish.pid")
  targets+=("varnish 127.0.0.1:$varnish_port")
else
  echo "varnish: not installed, left out (apt-get install varnish)"
fi

# Waits for an address to answer, then stores the object (two asks).
for t in "${targets[@]}"; do
  addr=${t#* }
  for _ in $(seq 1 100); do
    curl -s -o /dev/null "http://$addr/object" && break
    sleep 0.05
  done
  curl -s -o /dev/null "http://$addr/object"
done
# Each answers from its cache now, or the comparison means nothing.
hit=$(curl -s -D - -o /dev/null "http://127.0.0.1:$port/object")
echo "$hit" | grep -qi '^cache-status: cutover; hit' || { echo "cutover does not answer from its cache:"; echo "$hit"; exit 1; }
[ -n "$(find "$dir/nc" -type f 2>/dev/null)" ] || { echo "nginx stored nothing in $dir/nc:"; cat "$dir/cache-nginx.err"; exit 1; }
if [ -n "$varnish_pid" ]; then
  hit=$(curl -s -D - -o /dev/null "http://127.0.0.1:$varnish_port/object")
  echo "$hit" | grep -qiE '^x-varnish: [0-9]+ [0-9]+' || { echo "Varnish does not answer from its cache:"; echo "$hit"; exit 1; }
fi

# The pids whose threads' run time counts for a target.
pids_of() {
  case $1 in
    cutover) echo "$gateway" ;;
    nginx) echo "$(cat "$dir/cache-nginx.pid") $(pgrep -P "$(cat "$dir/cache-nginx.pid")" | tr '\n' ' ')" ;;
    varnish) echo "$varnish_pid $(pgrep -P "$varnish_pid" | tr '\n' ' ')" ;;
  esac
}

# One unmeasured pass over every target first: the first measured round
# otherwise falls on a machine still settling from the set-up (Varnish's
# child and VCL compiler start last), and it fell on cutover, first in
# every round (session 29: 8.0 µs in round 1, 7.2–7.7 after).
for t in "${targets[@]}"; do
  wrk -t1 -c64 -d2s "http://${t#* }/object" > /dev/null
done

declare -A rps cpu
for round in $(seq 1 "$rounds"); do
  for t in "${targets[@]}"; do
    name=${t%% *}; addr=${t#* }
    # shellcheck disable=SC2046
    before=$(run_ns $(pids_of "$name"))
    out=$(wrk -t1 -c64 -d"${seconds}s" "http://$addr/object")
    # shellcheck disable=SC2046
    after=$(run_ns $(pids_of "$name"))
    requests=$(echo "$out" | awk '/requests in/ {print $1}')
    r=$(echo "$out" | awk '/Requests\/sec/ {print $2}')
    c=$(python3 -c "print(round(($after - $before) / 1000 / $requests, 2))")
    echo "round $round: $name $r req/s, CPU $c µs/request"
    rps[$name]="${rps[$name]:-} $r"; cpu[$name]="${cpu[$name]:-} $c"
  done
done
median() { python3 -c "import statistics,sys; print(statistics.median(float(x) for x in sys.argv[1:]))" "$@"; }
# shellcheck disable=SC2086
base_cpu=$(median ${cpu[cutover]}); base_rps=$(median ${rps[cutover]})
for t in "${targets[@]:1}"; do
  name=${t%% *}
  # shellcheck disable=SC2086
  echo "cutover / $name: CPU per request $(python3 -c "print(round($base_cpu / $(median ${cpu[$name]}), 3))"), throughput $(python3 -c "print(round($base_rps / $(median ${rps[$name]}), 3))") (medians of $rounds rounds)"
done
