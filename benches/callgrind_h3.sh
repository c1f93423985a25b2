#!/usr/bin/env bash
# Instructions per HTTP/3 request, and per HTTPS (HTTP/1.1 over TLS 1.3)
# request on the same listener, of cutover binaries, counted by callgrind
# over the whole gateway process (docs/performance.md): the binary under
# callgrind in front of nginx `return 200` (its own process), the proxy
# bench's generators in their own process (`CUTOVER_BENCH_GENERATOR`,
# benches/http3/mod.rs) warm up for 2 s, the counters are zeroed, the
# generator runs SECONDS more and the counters are dumped. Binaries
# alternate ROUNDS times.
#
#   benches/callgrind_h3.sh GENERATOR BINARY... [-- ROUNDS SECONDS]
#
# GENERATOR is the proxy bench's binary (`cargo bench --bench proxy
# --no-run` prints it). Needs valgrind, nginx-light, openssl, python3.
# Loopback only; every process it starts is stopped by pid.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
generator=${1:?usage: benches/callgrind_h3.sh GENERATOR BINARY... [-- ROUNDS SECONDS]}
shift
binaries=()
while [ $# -gt 0 ] && [ "$1" != "--" ]; do binaries+=("$1"); shift; done
[ "${1:-}" = "--" ] && shift
rounds=${1:-2}
seconds=${2:-5}
for tool in valgrind callgrind_control nginx openssl python3; do
  command -v "$tool" > /dev/null || { echo "needs $tool (apt-get install valgrind nginx-light openssl python3)"; exit 1; }
done
dir=$(mktemp -d)
. "$here/one_route.sh"
gateway=
cleanup() {
  one_route_cleanup "$dir"
  rm -rf "$dir"
}
trap cleanup EXIT
back=$(start_backend "$dir")
openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes -days 2 \
  -keyout "$dir/key.pem" -out "$dir/cert.pem" -subj /CN=localhost \
  -addext subjectAltName=DNS:localhost -addext basicConstraints=critical,CA:FALSE 2> /dev/null

# Instructions per request of binary $1 for generator kind $2 (h3, https).
count() {
  local bin=$1 kind=$2 port admin out measured requests total=0
  port=$(free_port); admin=$(free_port); out=$dir/cg.$RANDOM
  write_gateway_config "$dir/gw.toml" "$admin" "$port" "$back"
  sed -i "s|^bind = \"127.0.0.1:$port\"|bind = \"127.0.0.1:$port\"\nprotocol = \"https\"\nhttp3 = true\ntls = { certificates = [{ cert = \"$dir/cert.pem\", key = \"$dir/key.pem\" }] }|" "$dir/gw.toml"
  valgrind --tool=callgrind --callgrind-out-file="$out" "$bin" run -c "$dir/gw.toml" > "$dir/out" 2> "$dir/err" &
  gateway=$!
  for _ in $(seq 1 600); do grep -q '"ready"' "$dir/out" 2>/dev/null && break; sleep 0.2; done
  CUTOVER_BENCH_GENERATOR="$kind,127.0.0.1:$port,$dir/cert.pem,2" "$generator" > /dev/null
  callgrind_control --zero "$gateway" > /dev/null 2>&1
  measured=$(CUTOVER_BENCH_GENERATOR="$kind,127.0.0.1:$port,$dir/cert.pem,$seconds" "$generator")
  callgrind_control --dump=measured "$gateway" > /dev/null 2>&1
  kill -TERM "$gateway"; wait "$gateway" 2>/dev/null || true; gateway=
  read -r requests errors _ <<< "$measured"
  [ "$errors" = 0 ] && [ "$requests" -gt 0 ] || { echo "generator: $measured" >&2; cat "$dir/err" >&2; exit 1; }
  for f in "$out".*; do
    if grep -q '^desc: Trigger.*measured' "$f"; then
      total=$(grep -h '^summary:\|^totals:' "$f" | head -1 | awk '{print $2}')
    fi
  done
  rm -f "$out"*
  echo "$(( total / requests )) $requests"
}

for round in $(seq 1 "$rounds"); do
  for bin in "${binaries[@]}"; do
    for kind in h3 https; do
      read -r per requests <<< "$(count "$bin" "$kind")"
      echo "round $round: $bin $kind: $per instructions per request ($requests requests)"
    done
  done
done
