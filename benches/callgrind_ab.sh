#!/usr/bin/env bash
# Instructions per proxied HTTP/1.1 (or h2c) request of two cutover binaries, counted
# by callgrind over the whole gateway process (docs/performance.md): the
# binary under callgrind in front of nginx `return 200` (its own process),
# `h2load --h1 -c4` warms up with 2 000 requests, the counters are zeroed,
# REQUESTS more are sent and the counters dumped. A and B alternate ROUNDS
# times; each round prints both and the ratio B / A. For a change that must
# not cost (a code move): build the previous commit in a worktree, then
#   benches/callgrind_ab.sh /tmp/old-target/release/cutover target/release/cutover
#
#   benches/callgrind_ab.sh A_BINARY B_BINARY [ROUNDS] [REQUESTS]
#
# ONE_ROUTE_ACCESS_LOG=1 turns the access log on (to a file) for both;
# PROTOCOL=grpc counts unary gRPC calls (h2c, 10 streams per connection,
# one framed message each way) to nginx over h2c, as `benches/grpc.rs`
# sends them: the backend side runs through hyper's HTTP/2 client.
# PROTOCOL=h2c counts h2c requests (prior knowledge, 10 streams per
# connection; STREAMS=N sets how many, and STREAMS=1 makes every
# connection go idle between its requests) instead of HTTP/1.1; CACHE=1 puts the route behind an
# in-memory cache zone (`ttl_default = "1h"`: the backend's answer states
# no freshness), so that every measured request is a cache hit. KEEP=DIR keeps each run's
# callgrind files there, for `callgrind_annotate`.
#
# Needs valgrind, nginx-light, nghttp2-client (h2load), python3 (apt-get
# install them). Loopback only; every process it starts is stopped by pid.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
a_bin=${1:?usage: benches/callgrind_ab.sh A_BINARY B_BINARY [ROUNDS] [REQUESTS]}
b_bin=${2:?usage: benches/callgrind_ab.sh A_BINARY B_BINARY [ROUNDS] [REQUESTS]}
rounds=${3:-2}
requests=${4:-20000}
for tool in valgrind callgrind_control nginx h2load python3; do
  command -v "$tool" > /dev/null || { echo "needs $tool (apt-get install valgrind nginx-light nghttp2-client python3)"; exit 1; }
done
case "${PROTOCOL:-h1}" in
  h1) load=(--h1) ;;
  h2c) load=(-m"${STREAMS:-10}") ;;
  grpc) load=(-m10 -H "content-type: application/grpc" -H "te: trailers") ;;
  *) echo "PROTOCOL is h1, h2c or grpc"; exit 1 ;;
esac
dir=$(mktemp -d)
. "$here/one_route.sh"
gateway=
cleanup() {
  one_route_cleanup "$dir"
  rm -rf "$dir"
}
trap cleanup EXIT
back=$(start_backend "$dir")
path=/
if [ "${PROTOCOL:-h1}" = grpc ]; then
  # The backend of benches/grpc.rs: one framed message and a
  # `grpc-status: 0` trailer for every call, over h2c.
  kill -TERM "$(cat "$dir/nginx.pid")"
  printf '\0\0\0\0\2\10\1' > "$dir/reply.bin"; cp "$dir/reply.bin" "$dir/request.bin"
  cat > "$dir/nginx.conf" <<NG
worker_processes 1; pid $dir/nginx.pid; error_log $dir/nginx.err;
events {}
http { access_log off; keepalive_requests 10000000; client_body_temp_path $dir;
  server { listen 127.0.0.1:$back http2; location / { root $dir; default_type application/grpc;
    add_trailer grpc-status 0 always; try_files /reply.bin =404; error_page 405 =200 \$uri; } } }
NG
  for _ in $(seq 1 50); do [ -e "$dir/nginx.pid" ] || break; sleep 0.1; done
  nginx -c "$dir/nginx.conf" -e "$dir/nginx.err"
  load+=(-d "$dir/request.bin")
  path=/bench.Echo/Unary
fi

# Instructions per request of one binary, one run.
count() {
  local bin=$1 port admin out
  port=$(free_port); admin=$(free_port); out=$dir/cg.$RANDOM
  write_gateway_config "$dir/gw.toml" "$admin" "$port" "$back"
  if [ "${PROTOCOL:-h1}" = grpc ]; then
    sed -i 's/^\[upstreams.app\]$/[upstreams.app]\nprotocol = "h2c"/' "$dir/gw.toml"
  fi
  if [ -n "${CACHE:-}" ]; then
    sed -i 's/^upstream = "app"$/upstream = "app"\ncache = { zone = "main", ttl_default = "1h" }/' "$dir/gw.toml"
    printf '[cache.zones.main]\nmemory = "64MiB"\n' >> "$dir/gw.toml"
  fi
  valgrind --tool=callgrind --callgrind-out-file="$out" "$bin" run -c "$dir/gw.toml" > "$dir/out" 2> "$dir/err" &
  gateway=$!
  for _ in $(seq 1 600); do grep -q '"ready"' "$dir/out" 2>/dev/null && break; sleep 0.2; done
  h2load "${load[@]}" -n 2000 -c4 "http://127.0.0.1:$port$path" > /dev/null 2>&1
  callgrind_control --zero "$gateway" > /dev/null 2>&1
  h2load "${load[@]}" -n "$requests" -c4 "http://127.0.0.1:$port$path" > "$dir/h2load" 2>&1
  callgrind_control --dump=measured "$gateway" > /dev/null 2>&1
  kill -TERM "$gateway"; wait "$gateway" 2>/dev/null || true; gateway=
  grep -q "succeeded, 0 failed, 0 errored" "$dir/h2load" || { echo "h2load saw failures:" >&2; cat "$dir/h2load" >&2; exit 1; }
  local total=0
  for f in "$out".*; do
    if grep -q '^desc: Trigger.*measured' "$f"; then
      total=$(grep -h '^summary:\|^totals:' "$f" | head -1 | awk '{print $2}')
    fi
  done
  if [ -n "${KEEP:-}" ]; then mkdir -p "$KEEP" && cp "$out".* "$KEEP/"; fi
  echo $(( total / requests ))
}

for round in $(seq 1 "$rounds"); do
  a=$(count "$a_bin"); b=$(count "$b_bin")
  python3 -c "print(f'round $round: A {$a} B {$b} instructions per request, B / A {$b/$a:.4f}')"
done
