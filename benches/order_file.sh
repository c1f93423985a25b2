#!/usr/bin/env bash
# Writes src/symbol-order.txt: the functions a gateway runs (the shipped
# example's, then a TLS listener's), for the linker to lay out together
# (src/build.rs; docs/performance.md, "The code a gateway runs, together").
#
#   benches/order_file.sh [BINARY]      # default target/release/cutover
#
# Runs BINARY under callgrind twice, each time its start, two idle seconds,
# three rounds of requests and a SIGTERM (it drains and exits as in
# production): on examples/gateway.toml (HTTP/1.1 and h2c to a direct
# response, a compressed proxied answer, the 404, the admin API's status,
# the metrics page), then on a TLS 1.3 listener proxying to a plain one
# (HTTP/1.1 and h2 by ALPN, a POST with a body). Every function of the
# binary that ran is listed once: the example's first, then the ones only
# the second run took, each group by instructions spent in it, most first.
# ORDER_OUT=FILE writes elsewhere (to compare). Uses ports 8080, 9190,
# 9191, 18080, 18443 and 19190 on loopback.
#
# Symbol names carry hashes of the toolchain, Cargo.lock and profile: run
# it again after any of them changes (a stale name is only skipped), and
# rebuild: cargo build --release. Needs valgrind, curl and openssl.
set -euo pipefail
cd "$(dirname "$0")/.."
binary=$(realpath "${1:-target/release/cutover}")
for tool in valgrind curl nm openssl; do
    command -v "$tool" >/dev/null || { echo "$0: $tool is not installed" >&2; exit 2; }
done

work=$(mktemp -d)
pid=
trap '[ -n "$pid" ] && kill "$pid" 2>/dev/null; wait 2>/dev/null; rm -rf "$work"' EXIT
ask() { curl -s -o /dev/null -w '%{http_code} ' "$@"; }

# profile NAME CONFIG: BINARY under callgrind on CONFIG until `requests`
# has run, then SIGTERM (it drains and exits, as in production).
profile() {
    valgrind --tool=callgrind --demangle=no --callgrind-out-file="$work/$1.cg" \
        "$binary" run -c "$2" >"$work/out" 2>"$work/err" &
    pid=$!
    for _ in $(seq 1 240); do
        grep -q '"ready"' "$work/out" 2>/dev/null && break
        sleep 0.5
    done
    grep -q '"ready"' "$work/out" || { echo "$0: no ready line:" >&2; cat "$work/err" >&2; exit 1; }
    sleep 2
    "requests_$1"
    echo
    sleep 1
    kill -TERM "$pid"
    wait "$pid" || true
    pid=
}

requests_example() {
    for _ in 1 2 3; do
        ask http://127.0.0.1:8080/
        ask --http2-prior-knowledge http://127.0.0.1:8080/
        ask --compressed http://127.0.0.1:8080/metrics
        ask http://127.0.0.1:8080/nothing-here
        ask http://127.0.0.1:9190/admin/runtime/status
        ask http://127.0.0.1:9191/metrics
    done
}

# Then what the example has not: a TLS 1.3 listener (HTTP/1.1 and h2 by
# ALPN) whose route is proxied to a plain listener of the same process.
openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -days 1 \
    -subj /CN=localhost -addext subjectAltName=DNS:localhost \
    -keyout "$work/key.pem" -out "$work/cert.pem" 2>/dev/null
cat >"$work/tls.toml" <<TOML
[admin]
bind = "127.0.0.1:19190"

[[listeners]]
name = "plain"
bind = "127.0.0.1:18080"
protocol = "http"

[[listeners]]
name = "secure"
bind = "127.0.0.1:18443"
protocol = "https"
tls.certificates = [{ cert = "$work/cert.pem", key = "$work/key.pem" }]

[[routes]]
name = "answer"
listeners = ["plain"]
respond = { status = 200, body = "hello\n" }

[[routes]]
name = "through"
listeners = ["secure"]
upstream = "plain"

[upstreams.plain]
backends = [{ addr = "127.0.0.1:18080" }]
TOML
requests_tls() {
    for _ in 1 2 3; do
        ask --cacert "$work/cert.pem" https://localhost:18443/
        ask --cacert "$work/cert.pem" --http2 https://localhost:18443/
        ask --cacert "$work/cert.pem" --http1.1 -X POST -d 'a body' https://localhost:18443/
    done
}

profile example examples/gateway.toml
profile tls "$work/tls.toml"

nm --defined-only "$binary" | awk '$2 ~ /^[tTwW]$/ { print $3 }' >"$work/defined"
python3 - "$work/defined" "$binary" "$work/example.cg" "$work/tls.cg" >"$work/order" <<'EOF'
import re, sys


def spent_by_function(profile, binary):
    """Instructions spent in each function of `binary`, from a callgrind file."""
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
    return spent


defined_file, binary, profiles = sys.argv[1], sys.argv[2], sys.argv[3:]
defined = set(open(defined_file).read().split())
listed = set()
# Each profile's functions, most instructions first, after the ones an
# earlier profile listed: the shipped example's come first and together.
for profile in profiles:
    spent = spent_by_function(profile, binary)
    new = sorted((f for f in spent if f in defined and f not in listed), key=lambda f: (-spent[f], f))
    listed.update(new)
    print("\n".join(new))
    print(f"{profile}: {len(new)} more functions", file=sys.stderr)
EOF
# Replaced only once written whole.
mv "$work/order" "${ORDER_OUT:-src/symbol-order.txt}"
echo "wrote ${ORDER_OUT:-src/symbol-order.txt}; rebuild with cargo build --release"
