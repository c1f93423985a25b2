#!/usr/bin/env bash
# The shadow stage's cost per request (docs/performance.md, "Shadow stage"):
# instructions per request of the whole gateway process, without and with
# a shadow stage running at PERCENT %, counted by callgrind, which is zeroed
# and dumped around each phase of one run. The backend is nginx `return 200`
# in its own process; the candidate renames the route and copies to the same
# nginx.
#
#   benches/shadow_callgrind.sh [PERCENT] [REQUESTS]
#
# Needs valgrind, nginx-light, nghttp2-client (h2load), curl, python3.
set -eu
PCT=${1:-10}; N=${2:-20000}
cd "$(dirname "$0")/.."
cargo build --release --quiet
BIN=$PWD/target/release/cutover
for tool in valgrind callgrind_control nginx h2load curl python3; do
  command -v $tool > /dev/null || { echo "needs $tool (apt-get install valgrind nginx-light nghttp2-client curl python3)"; exit 1; }
done
D=$(mktemp -d)
free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
BACK=$(free_port); PORT=$(free_port); ADMIN=$(free_port)
cat > $D/nginx.conf <<NG
worker_processes 1; pid $D/nginx.pid; error_log $D/nginx.err;
events {}
http { access_log off; keepalive_requests 10000000; server { listen 127.0.0.1:$BACK; location / { return 200 "hello, world\n"; } } }
NG
nginx -c $D/nginx.conf -e $D/nginx.err
trap 'kill $(cat $D/nginx.pid) 2>/dev/null; rm -rf $D' EXIT
conf() {
cat <<CFG
[admin]
bind = "127.0.0.1:$ADMIN"
[log]
level = "warn"
[[listeners]]
name = "web"
bind = "127.0.0.1:$PORT"
[[routes]]
name = "$1"
listeners = ["web"]
upstream = "app"
[upstreams.app]
backends = [{ addr = "127.0.0.1:$BACK" }]
CFG
}
conf all > $D/gw.toml
conf renamed > $D/candidate.toml
valgrind --tool=callgrind --callgrind-out-file=$D/cg.out $BIN run -c $D/gw.toml > $D/out 2> $D/err &
pid=$!
for i in $(seq 1 300); do grep -q '"ready"' $D/out 2>/dev/null && break; sleep 0.2; done
h2load --h1 -n 2000 -c4 http://127.0.0.1:$PORT/ > /dev/null 2>&1
callgrind_control --zero $pid > /dev/null
h2load --h1 -n $N -c4 http://127.0.0.1:$PORT/ > /dev/null 2>&1
callgrind_control --dump=plain $pid > /dev/null
python3 - "$D/candidate.toml" "$PCT" > $D/body.json <<'PY'
import json, sys
print(json.dumps({"config": open(sys.argv[1]).read(), "shadow": {"percent": float(sys.argv[2]), "duration": "1h"}}))
PY
curl -s -o $D/activation.json -H 'content-type: application/json' --data @$D/body.json http://127.0.0.1:$ADMIN/admin/runtime/activate &
for i in $(seq 1 300); do curl -s http://127.0.0.1:$ADMIN/admin/runtime/status | grep -q '"running"' && break; sleep 0.2; done
h2load --h1 -n 2000 -c4 http://127.0.0.1:$PORT/ > /dev/null 2>&1
callgrind_control --zero $pid > /dev/null
h2load --h1 -n $N -c4 http://127.0.0.1:$PORT/ > /dev/null 2>&1
callgrind_control --dump=shadow $pid > /dev/null
curl -s http://127.0.0.1:$ADMIN/admin/runtime/status | python3 -c 'import json,sys; print("copies:", json.load(sys.stdin)["shadow"]["copies"])'
curl -s -o /dev/null -H 'content-type: application/json' -d '{"generation":2}' http://127.0.0.1:$ADMIN/admin/runtime/abort
kill -TERM $pid; wait $pid || true
plain=0; shadow=0
for f in $D/cg.out.*; do
  total=$(grep -h '^summary:\|^totals:' $f | head -1 | awk '{print $2}')
  case "$(grep -h '^desc: Trigger' $f)" in
    *plain*) plain=$(( total / N ));;
    *shadow*) shadow=$(( total / N ));;
  esac
done
python3 -c "print(f'instructions per request: {$plain} without a shadow, {$shadow} with one at $PCT %: {($shadow/$plain-1)*100:+.1f} %')"
