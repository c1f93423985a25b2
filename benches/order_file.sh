#!/usr/bin/env bash
# Writes src/symbol-order.txt: the functions a gateway runs on the shipped
# example, hottest first, for the linker to lay out together (src/build.rs;
# docs/performance.md, "The code a gateway runs, together").
#
#   benches/order_file.sh [BINARY]      # default target/release/cutover
#
# Runs BINARY under callgrind on examples/gateway.toml: its start, an idle
# second or two, and three rounds of the requests the example answers
# (HTTP/1.1 and h2c to a direct response, a compressed proxied answer, the
# 404, the admin API's status, the metrics page); stops it with SIGTERM so
# that it drains and exits as in production. Every function of the binary
# that ran is listed once, by instructions spent in it, most first.
#
# Symbol names carry hashes of the toolchain, Cargo.lock and profile: run
# it again after any of them changes (a stale name is only skipped), and
# rebuild: cargo build --release. Needs valgrind and curl.
set -euo pipefail
cd "$(dirname "$0")/.."
binary=$(realpath "${1:-target/release/cutover}")
for tool in valgrind curl nm; do
    command -v "$tool" >/dev/null || { echo "$0: $tool is not installed" >&2; exit 2; }
done

work=$(mktemp -d)
pid=
trap '[ -n "$pid" ] && kill "$pid" 2>/dev/null; wait 2>/dev/null; rm -rf "$work"' EXIT

valgrind --tool=callgrind --demangle=no --callgrind-out-file="$work/cg.out" \
    "$binary" run -c examples/gateway.toml >"$work/out" 2>"$work/err" &
pid=$!
for _ in $(seq 1 240); do
    grep -q '"ready"' "$work/out" 2>/dev/null && break
    sleep 0.5
done
grep -q '"ready"' "$work/out" || { echo "$0: no ready line:" >&2; cat "$work/err" >&2; exit 1; }
sleep 2
ask() { curl -s -o /dev/null -w '%{http_code} ' "$@"; }
for _ in 1 2 3; do
    ask http://127.0.0.1:8080/
    ask --http2-prior-knowledge http://127.0.0.1:8080/
    ask --compressed http://127.0.0.1:8080/metrics
    ask http://127.0.0.1:8080/nothing-here
    ask http://127.0.0.1:9190/admin/runtime/status
    ask http://127.0.0.1:9191/metrics
done
echo
sleep 1
kill -TERM "$pid"
wait "$pid" || true
pid=

nm --defined-only "$binary" | awk '$2 ~ /^[tTwW]$/ { print $3 }' >"$work/defined"
python3 - "$work/cg.out" "$work/defined" "$binary" >src/symbol-order.txt <<'EOF'
import re, sys
profile, defined, binary = sys.argv[1], sys.argv[2], sys.argv[3]
defined = set(open(defined).read().split())
objects, names, spent = {}, {}, {}
current_object = current_fn = None
after_calls = False
for line in open(profile, errors="replace"):
    line = line.rstrip("\n")
    m = re.match(r"(c?ob|c?fn|c?fi|c?fe|fl)=\((\d+)\)(?: (.*))?$", line)
    if m:
        kind, key, name = m.groups()
        if kind in ("ob", "cob"):
            if name:
                objects[key] = name
            if kind == "ob":
                current_object = objects[key]
        elif kind in ("fn", "cfn"):
            if name:
                names[key] = name
            if kind == "fn":
                current_fn = names[key] if current_object == binary else None
                if current_fn:
                    spent.setdefault(current_fn, 0)
        continue
    if line.startswith("calls="):
        after_calls = True  # the next cost line is the call's, not this function's
        continue
    if line[:1].isdigit() or line[:1] in ("+", "-", "*"):
        fields = line.split()
        if current_fn and not after_calls and len(fields) > 1 and fields[1].isdigit():
            spent[current_fn] += int(fields[1])
    after_calls = False
order = sorted((f for f in spent if f in defined), key=lambda f: (-spent[f], f))
print("\n".join(order))
print(f"{len(order)} functions ran", file=sys.stderr)
EOF
echo "wrote src/symbol-order.txt; rebuild with cargo build --release"
