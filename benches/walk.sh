#!/usr/bin/env bash
# One request's walk through the source (issue 55, docs/architecture.md):
# which files of src/proxy/, src/admission.rs and src/backends/ its calls
# enter, in order, from the accept loop to the backend and back, and how
# often it enters a file it had left. The dev build of the gateway
# serves one route to nginx `return 200` on one worker thread; gdb
# attaches once it is ready, breaks on every function of those modules
# (`rbreak`), one request is sent, and each hit's file is logged.
# Consecutive hits in one file are one visit; a return is a visit to a
# file visited before. Prints the files in order and the counts.
#
#   benches/walk.sh [BINARY]     (default target/debug/cutover)
#
# BINARY needs full debug info for cutover's own functions (the dev
# profile keeps line tables only, which name no function to break on):
#   CARGO_PROFILE_DEV_DEBUG=true cargo build
#
# Needs gdb, nginx-light, curl, python3 (apt-get install them). Loopback
# only; every process it starts is stopped by pid.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
cd "$(dirname "$0")/.."
bin=${1:-target/debug/cutover}
for tool in gdb nginx curl python3; do
  command -v "$tool" > /dev/null || { echo "needs $tool (apt-get install gdb nginx-light curl python3)"; exit 1; }
done
dir=$(mktemp -d)
. "$here/one_route.sh"
gateway=
cleanup() {
  one_route_cleanup "$dir"
  [ -n "${WALK_KEEP:-}" ] && echo "kept: $dir" || rm -rf "$dir"
}
trap cleanup EXIT
back=$(start_backend "$dir")
port=$(free_port); admin=$(free_port)
write_gateway_config "$dir/gw.toml" "$admin" "$port" "$back"
"$bin" run -c "$dir/gw.toml" > "$dir/out" 2> "$dir/err" &
gateway=$!
for _ in $(seq 1 300); do curl -sf "http://127.0.0.1:$admin/admin/ready" > /dev/null 2>&1 && break; sleep 0.1; done
# Warm: the backend connection and every lazy piece exist before the
# request that is followed (it reuses the pooled connection).
curl -s -o /dev/null "http://127.0.0.1:$port/"
cat > "$dir/gdb.cmd" <<'GDB'
set pagination off
set confirm off
set print frame-arguments none
set print address off
set breakpoint pending off
handle SIGPIPE nostop noprint pass
python
import gdb, re
# Every function of the followed modules, by the file and line where it
# starts (one breakpoint covers all its instantiations).
places = set()
for pattern in ("^cutover::proxy::", "^cutover::admission::", "^cutover::backends::h1::"):
    listing = gdb.execute(f"info functions {pattern}", to_string=True)
    file = None
    for line in listing.splitlines():
        header = re.match(r"^File (.+):$", line)
        if header:
            file = header.group(1)
            continue
        entry = re.match(r"^(\d+):\s", line)
        if file and entry and file.startswith("src/"):
            places.add((file, int(entry.group(1))))
for file, line in sorted(places):
    try:
        b = gdb.Breakpoint(f"{file}:{line}", internal=False)
        b.silent = True
        b.commands = f"python print('HIT {file} ' + str(gdb.selected_frame().name()))\ncontinue"
    except gdb.error:
        pass
print(f"{len(places)} places")
end
echo READY\n
continue
GDB
gdb -batch -x "$dir/gdb.cmd" -p "$gateway" > "$dir/gdb.out" 2>&1 &
debugger=$!
for _ in $(seq 1 1200); do grep -q READY "$dir/gdb.out" 2>/dev/null && break; sleep 0.5; done
if grep -q '^0 places' "$dir/gdb.out"; then
  echo "no function of cutover to break on in $bin: build it with CARGO_PROFILE_DEV_DEBUG=true cargo build"
  exit 1
fi
sleep 2
curl -s -o /dev/null -w '%{http_code}\n' --max-time 120 "http://127.0.0.1:$port/" > "$dir/status"
sleep 2
kill -INT "$debugger" 2>/dev/null || true
kill -KILL "$gateway" 2>/dev/null || true; gateway=
wait "$debugger" 2>/dev/null || true
echo "status: $(cat "$dir/status")"
python3 - "$dir/gdb.out" <<'PY'
import sys
hits = [l.split(' ')[1].strip() for l in open(sys.argv[1], errors='replace') if l.startswith('HIT ')]
hits = [h[h.find('src/'):] if 'src/' in h else h for h in hits]
# What hyper polls on every read and write of the client connection.
io = {'src/proxy/observed.rs', 'src/proxy/downstream.rs', 'src/proxy/interim.rs',
      'src/proxy/activity.rs', 'src/proxy/framing.rs', 'src/proxy/request_framing.rs'}

def walk(label, entries):
    visits = []
    for h in entries:
        if not visits or visits[-1] != h:
            visits.append(h)
    seen, returns, per_file = set(), 0, {}
    for v in visits:
        if v in seen:
            returns += 1
            per_file[v] = per_file.get(v, 0) + 1
        seen.add(v)
    print(f"{label}: {len(entries)} function entries, {len(visits)} visits to {len(seen)} files, {returns} returns to a file left before")
    for f, n in sorted(per_file.items(), key=lambda x: -x[1]):
        print(f"  {n:4} returns to {f}")
    print("  walk:", " -> ".join(v.replace('src/', '') for v in visits))

walk("the whole request", hits)
# From the accept loop to the first entry into the backend codec after
# the request path's entry, without hyper's I/O callbacks.
path = [h for h in hits if h not in io]
entry = next((i for i, h in enumerate(path) if h.endswith(('request.rs', 'http.rs'))), 0)
end = next((i for i, h in enumerate(path) if 'backends/h1' in h and i > entry), len(path) - 1)
walk("accept to backend, without I/O callbacks", path[:end + 1])
PY
