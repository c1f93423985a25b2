#!/usr/bin/env bash
# Idle resident memory as a user's `ps` shows it: starts each binary on
# the shipped example (examples/gateway.toml: access log on, two
# listeners, the admin API and metrics), waits for its ready line, reads
# VmRSS and AnonHugePages from /proc 3 s after the start, stops it, and
# alternates the binaries STARTS times. First it says how many of the
# functions src/symbol-order.txt lists each binary defines (laid out
# together by a release build; docs/performance.md).
#
#   benches/idle_rss.sh BINARY [BINARY ...] [-- STARTS]
#
# e.g. benches/idle_rss.sh /tmp/old-target/release/cutover target/release/cutover -- 3
# The example binds fixed loopback ports (8080, 9190, 9191): one process
# at a time, and none other on them. Every process it starts is stopped by
# pid on exit.
set -euo pipefail
cd "$(dirname "$0")/.."

binaries=()
starts=3
while [ $# -gt 0 ]; do
    if [ "$1" = "--" ]; then
        starts=${2:?STARTS after --}
        break
    fi
    binaries+=("$1")
    shift
done
[ ${#binaries[@]} -gt 0 ] || { echo "usage: $0 BINARY [BINARY ...] [-- STARTS]" >&2; exit 2; }

pid=
trap '[ -n "$pid" ] && kill "$pid" 2>/dev/null; wait 2>/dev/null || true' EXIT
work=$(mktemp -d)

# How much of the code layout a release build of this source can give each
# binary (src/build.rs): the names of src/symbol-order.txt it defines. Few
# means the file is stale (another toolchain or Cargo.lock): regenerate it.
for bin in "${binaries[@]}"; do
    if command -v nm >/dev/null; then
        defined=$(nm --defined-only "$bin" 2>/dev/null | awk '{ print $3 }' |
            sort -u | comm -12 - <(sort -u src/symbol-order.txt) | wc -l)
        printf '%-48s defines %d of the %d functions src/symbol-order.txt lists\n' \
            "$bin" "$defined" "$(wc -l <src/symbol-order.txt)"
    fi
done

for round in $(seq 1 "$starts"); do
    for bin in "${binaries[@]}"; do
        "$bin" run -c examples/gateway.toml >"$work/out" 2>"$work/err" &
        pid=$!
        started=$(date +%s.%N)
        for _ in $(seq 1 100); do
            grep -q '"ready"' "$work/out" 2>/dev/null && break
            sleep 0.05
        done
        grep -q '"ready"' "$work/out" || { echo "$bin did not get ready:" >&2; cat "$work/err" >&2; exit 1; }
        # 3 s after the start, not after the ready line.
        sleep "$(echo "3 - ($(date +%s.%N) - $started)" | bc -l | sed 's/^-.*/0/')"
        rss=$(awk '/^VmRSS:/ {print $2}' "/proc/$pid/status")
        huge=$(awk '/^AnonHugePages:/ {print $2}' "/proc/$pid/smaps_rollup")
        printf 'round %d  %-48s VmRSS %6.1f MiB  AnonHugePages %5.1f MiB\n' \
            "$round" "$bin" "$(echo "$rss / 1024" | bc -l)" "$(echo "$huge / 1024" | bc -l)"
        kill "$pid"
        wait "$pid" 2>/dev/null || true
        pid=
    done
done
rm -rf "$work"
