#!/usr/bin/env bash
# System calls, futex calls, context switches and CPU per request of
# cutover, HAProxy and nginx as HTTP/2 fronts (h2c with prior knowledge,
# and TLS 1.3 with ALPN h2), each in front of one nginx answering
# `return 200` in its own process, under the same `h2load -t1 -c16 -m10`.
# Counted by `perf stat` on the tracepoints (raw_syscalls:sys_enter and
# the named syscalls), attached to every thread of the front for exactly
# the h2load run, divided by the requests h2load completed. Prints a
# Markdown table (docs/performance.md keeps it).
#
#   benches/syscalls.sh [CUTOVER_BINARY] [REQUESTS]
#
# e.g. benches/syscalls.sh target/release/cutover 100000
# Installs nginx-light, haproxy, nghttp2-client (h2load), openssl and
# linux-perf from Debian's packages when missing. Loopback only; every
# process it starts is stopped by pid on exit.
set -euo pipefail
cd "$(dirname "$0")/.."

cutover=${1:-target/release/cutover}
requests=${2:-100000}
[ -x "$cutover" ] || { echo "no $cutover: cargo build --release first" >&2; exit 2; }

need=()
command -v nginx >/dev/null || need+=(nginx-light)
command -v haproxy >/dev/null || need+=(haproxy)
command -v h2load >/dev/null || need+=(nghttp2-client)
command -v openssl >/dev/null || need+=(openssl)
command -v perf >/dev/null || need+=(linux-perf)
if [ ${#need[@]} -gt 0 ]; then
    DEBIAN_FRONTEND=noninteractive apt-get install -y -q "${need[@]}" >/dev/null
fi

. benches/one_route.sh
. benches/h2_fronts.sh
work=$(mktemp -d)
pids=()
cleanup() {
    for pid in "${pids[@]}"; do kill "$pid" 2>/dev/null || true; done
    one_route_cleanup "$work"
    wait 2>/dev/null || true
    rm -rf "$work"
}
trap cleanup EXIT

make_cert "$work"
backend=$(start_backend "$work")

# cutover: plain (h2c by prior knowledge) and TLS (ALPN h2).
c_h2c=$(free_port); c_tls=$(free_port); c_admin=$(free_port)
cutover_h2_config "$work" "$c_admin" "$c_h2c" "$c_tls" "$backend"
"$cutover" run -c "$work/cutover.toml" >"$work/cutover.log" 2>&1 &
cutover_pid=$!
pids+=("$cutover_pid")

h_h2c=$(free_port); h_tls=$(free_port)
haproxy_h2_config "$work" "$h_h2c" "$h_tls" "$backend" 2
haproxy -f "$work/haproxy.cfg" -db >"$work/haproxy.log" 2>&1 &
haproxy_pid=$!
pids+=("$haproxy_pid")

n_h2c=$(free_port); n_tls=$(free_port)
nginx_h2_config "$work" "$n_h2c" "$n_tls" "$backend" 2
nginx -c "$work/front-nginx.conf" -e "$work/front-nginx-error.log" &
nginx_pid=$!
pids+=("$nginx_pid")

for port in "$backend" "$c_h2c" "$c_tls" "$h_h2c" "$h_tls" "$n_h2c" "$n_tls"; do wait_port "$port"; done
sleep 0.5
# nginx serves from its workers: count them, not the master.
nginx_workers=$(pgrep -P "$nginx_pid" | paste -sd, -)

events=raw_syscalls:sys_enter,syscalls:sys_enter_futex
events+=,syscalls:sys_enter_write,syscalls:sys_enter_writev,syscalls:sys_enter_sendto,syscalls:sys_enter_sendmsg
events+=,syscalls:sys_enter_read,syscalls:sys_enter_readv,syscalls:sys_enter_recvfrom,syscalls:sys_enter_recvmsg
events+=,syscalls:sys_enter_epoll_wait,syscalls:sys_enter_epoll_pwait,syscalls:sys_enter_epoll_ctl
events+=,context-switches,task-clock

# measure NAME PIDS URL -> one table row
measure() {
    local name=$1 targets=$2 url=$3
    h2load -t1 -c16 -m10 -n 5000 "$url" >/dev/null 2>&1
    perf stat -x, -e "$events" -p "$targets" -o "$work/perf.csv" -- \
        h2load -t1 -c16 -m10 -n "$requests" "$url" >"$work/h2load.out" 2>&1
    local done
    done=$(awk '/^requests:/ {print $8}' "$work/h2load.out")
    if [ -z "$done" ] || [ "$done" = 0 ]; then
        echo "$name: h2load completed nothing:" >&2
        cat "$work/h2load.out" >&2
        exit 1
    fi
    awk -F, -v name="$name" -v n="$done" '
        $3 ~ /raw_syscalls:sys_enter/ { all = $1 }
        $3 ~ /sys_enter_futex/ { futex = $1 }
        $3 ~ /sys_enter_(write|writev|sendto|sendmsg)$/ { writes += $1 }
        $3 ~ /sys_enter_(read|readv|recvfrom|recvmsg)$/ { reads += $1 }
        $3 ~ /sys_enter_epoll_(wait|pwait)$/ { waits += $1 }
        $3 ~ /sys_enter_epoll_ctl/ { ctl = $1 }
        $3 ~ /context-switches/ { cs = $1 }
        $3 ~ /task-clock/ { cpu = $1 }
        END {
            printf "| %s | %.2f | %.2f | %.2f | %.2f | %.3f | %.3f | %.3f | %.2f | %d |\n",
                name, all / n, writes / n, reads / n, waits / n, ctl / n, futex / n, cs / n, cpu * 1000 / n, n
        }' "$work/perf.csv"
}

echo "| front, protocol | syscalls / request | writes | reads | epoll waits | epoll_ctl | futex | context switches | CPU µs / request | requests |"
echo "|---|---|---|---|---|---|---|---|---|---|"
measure "cutover, h2c" "$cutover_pid" "http://127.0.0.1:$c_h2c/"
measure "HAProxy, h2c" "$haproxy_pid" "http://127.0.0.1:$h_h2c/"
measure "nginx, h2c" "$nginx_workers" "http://127.0.0.1:$n_h2c/"
measure "cutover, TLS h2" "$cutover_pid" "https://127.0.0.1:$c_tls/"
measure "HAProxy, TLS h2" "$haproxy_pid" "https://127.0.0.1:$h_tls/"
measure "nginx, TLS h2" "$nginx_workers" "https://127.0.0.1:$n_tls/"
