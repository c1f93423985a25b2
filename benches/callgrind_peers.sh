#!/usr/bin/env bash
# Instructions per HTTP/2 request of cutover, HAProxy and nginx as fronts
# of one nginx `return 200` (its own process), h2c by prior knowledge and
# TLS 1.3 with ALPN h2, each front under callgrind: `h2load -c4 -m10`
# warms up with 2 000 requests, the counters are zeroed, REQUESTS more
# are sent and the counters dumped. One thread or process per front
# (callgrind runs one at a time anyway): cutover `worker_threads = 1`,
# HAProxy `nbthread 1`, nginx without its master. For cutover it also
# prints where the instructions go, by crate (self cost, from
# `callgrind_annotate`). Prints Markdown tables (docs/performance.md).
# KEEP=DIR keeps the callgrind files (NAME.h2c, NAME.tls) there.
#
#   benches/callgrind_peers.sh [CUTOVER_BINARY] [REQUESTS]
#
# Installs valgrind, nginx-light, haproxy, nghttp2-client and openssl
# from Debian's packages when missing. Loopback only; every process it
# starts is stopped by pid on exit.
set -euo pipefail
cd "$(dirname "$0")/.."

cutover=${1:-target/release/cutover}
requests=${2:-20000}
[ -x "$cutover" ] || { echo "no $cutover: cargo build --release first" >&2; exit 2; }

need=()
command -v valgrind >/dev/null || need+=(valgrind)
command -v nginx >/dev/null || need+=(nginx-light)
command -v haproxy >/dev/null || need+=(haproxy)
command -v h2load >/dev/null || need+=(nghttp2-client)
command -v openssl >/dev/null || need+=(openssl)
if [ ${#need[@]} -gt 0 ]; then
    DEBIAN_FRONTEND=noninteractive apt-get install -y -q "${need[@]}" >/dev/null
fi

. benches/one_route.sh
. benches/h2_fronts.sh
work=$(mktemp -d)
chmod 755 "$work"
front=
cleanup() {
    [ -n "$front" ] && kill "$front" 2>/dev/null || true
    one_route_cleanup "$work"
    wait 2>/dev/null || true
    rm -rf "$work"
}
trap cleanup EXIT

make_cert "$work"
backend=$(start_backend "$work")
plain=$(free_port); secure=$(free_port); admin=$(free_port)

cutover_h2_config "$work" "$admin" "$plain" "$secure" "$backend" 1
haproxy_h2_config "$work" "$plain" "$secure" "$backend" 1
nginx_h2_config "$work" "$plain" "$secure" "$backend" 0

# measure NAME -- COMMAND...: starts the front under callgrind, then for
# each protocol prints "NAME PROTOCOL INSTRUCTIONS_PER_REQUEST" and keeps
# the dump as $work/NAME.PROTOCOL.
measure() {
    local name=$1; shift 2
    valgrind --tool=callgrind --callgrind-out-file="$work/$name.cg" "$@" >"$work/$name.log" 2>&1 &
    front=$!
    wait_port "$plain"; wait_port "$secure"
    # cutover serves before it is ready: its ready line waits for the
    # hash of its own executable, which under callgrind takes long enough
    # to land in the counted run.
    if [ "$name" = cutover ]; then
        for _ in $(seq 1 1500); do grep -q '"ready"' "$work/$name.log" 2>/dev/null && break; sleep 0.2; done
    fi
    local protocol url n
    for protocol in h2c tls; do
        case $protocol in
            h2c) url=http://127.0.0.1:$plain/ ;;
            tls) url=https://127.0.0.1:$secure/ ;;
        esac
        h2load -c4 -m10 -n 2000 "$url" >/dev/null 2>&1
        callgrind_control --zero "$front" >/dev/null 2>&1
        h2load -c4 -m10 -n "$requests" "$url" >"$work/h2load" 2>&1
        callgrind_control --dump="$name-$protocol" "$front" >/dev/null 2>&1
        grep -q "$requests succeeded, 0 failed" "$work/h2load" || { echo "$name $protocol: h2load saw failures:" >&2; cat "$work/h2load" >&2; exit 1; }
        n=0
        for f in "$work/$name.cg".*; do
            if grep -q "^desc: Trigger.*$name-$protocol\$" "$f"; then
                n=$(grep -h '^summary:\|^totals:' "$f" | head -1 | awk '{print $2}')
                mv "$f" "$work/$name.$protocol"
            fi
        done
        echo "$name $protocol $((n / requests))"
    done
    kill -TERM "$front"; wait "$front" 2>/dev/null || true; front=
    sleep 0.5
}

{
    measure cutover -- "$cutover" run -c "$work/cutover.toml"
    measure haproxy -- haproxy -f "$work/haproxy.cfg" -db
    measure nginx -- nginx -c "$work/front-nginx.conf" -e "$work/front-nginx-error.log"
} | tee "$work/totals"
if [ -n "${KEEP:-}" ]; then mkdir -p "$KEEP" && cp "$work"/*.h2c "$work"/*.tls "$KEEP/"; fi

echo
echo "| front | h2c instructions / request | TLS h2 instructions / request |"
echo "|---|---|---|"
for name in cutover haproxy nginx; do
    awk -v n="$name" '$1 == n { v[$2] = $3 } END { printf "| %s | %d | %d |\n", n, v["h2c"], v["tls"] }' "$work/totals"
done

# cutover's instructions by crate: each function's own cost, grouped by
# the crate its source file is in (or the library it was linked from).
echo
echo "| cutover, by crate (self cost) | h2c / request | TLS h2 / request |"
echo "|---|---|---|"
for protocol in h2c tls; do
    callgrind_annotate --auto=no --inclusive=no --threshold=100 "$work/cutover.$protocol" 2>/dev/null |
        awk -v r="$requests" -v p="$protocol" '
            # The totals, and the thread entries callgrind lists at 100 %
            # (the whole run again), are no function of its own.
            /PROGRAM TOTALS|\(100\.0%\)/ { next }
            /^ *[0-9,]+ +\([ 0-9.]+%\) +[^ ]/ {
                n = $1; gsub(",", "", n)
                where = $0; sub(/^ *[0-9,]+ +\([ 0-9.]+%\) +/, "", where)
                crate = "other"
                if (match(where, /\.cargo\/registry\/src\/[^\/]+\/[^\/]+/)) {
                    crate = substr(where, RSTART, RLENGTH); sub(/.*\//, "", crate)
                    sub(/-[0-9]+\.[0-9]+\.[0-9]+.*$/, "", crate)
                } else if (where ~ /^\/rustc\//) {
                    crate = "std (core, alloc)"
                } else if (where ~ /(^|\/)src\// && where ~ /cutover::/) {
                    crate = "cutover"
                } else if (where ~ /libc\.so/) {
                    crate = "libc (memcpy, memmove, ...)"
                } else if (where ~ /mimalloc/) {
                    crate = "libmimalloc-sys"
                }
                print p "\t" crate "\t" n / r
            }'
done | python3 -c '
import collections, sys
by = collections.defaultdict(lambda: collections.Counter())
for line in sys.stdin:
    protocol, crate, n = line.rstrip("\n").split("\t")
    by[crate][protocol] += float(n)
for crate, n in sorted(by.items(), key=lambda kv: -sum(kv[1].values())):
    print("| %s | %.0f | %.0f |" % (crate, n["h2c"], n["tls"]))
'
