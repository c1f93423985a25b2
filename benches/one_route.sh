# Sourced by the bench scripts: a free loopback port, nginx answering
# `return 200` from one worker in its own process, a gateway
# configuration with one route to it on one worker thread, and the CPU
# time of processes.
# Every process started here is stopped by pid in `one_route_cleanup`.

free_port() {
  python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'
}

# Starts nginx in folder $1 on a free port; prints the port.
start_backend() {
  local dir=$1 back
  back=$(free_port)
  cat > "$dir/nginx.conf" <<NG
worker_processes 1; pid $dir/nginx.pid; error_log $dir/nginx.err;
events {}
http { access_log off; keepalive_requests 10000000; server { listen 127.0.0.1:$back; location / { return 200 "hello, world\n"; } } }
NG
  nginx -c "$dir/nginx.conf" -e "$dir/nginx.err"
  echo "$back"
}

# Writes $1: admin on $2, the `web` listener on $3, one route to the
# backend on $4, one data-plane worker; with ONE_ROUTE_ACCESS_LOG=1 set,
# the access log on, written to $1.access.log.
write_gateway_config() {
  local access=
  [ -n "${ONE_ROUTE_ACCESS_LOG:-}" ] && access=$(printf 'access = true\naccess_file = "%s"' "$1.access.log")
  cat > "$1" <<CFG
[admin]
bind = "127.0.0.1:$2"
[log]
level = "warn"
$access
[runtime]
worker_threads = 1
[[listeners]]
name = "web"
bind = "127.0.0.1:$3"
[[routes]]
name = "all"
listeners = ["web"]
upstream = "app"
[upstreams.app]
backends = [{ addr = "127.0.0.1:$4" }]
CFG
}

# The scheduler's run time (ns) of every thread of the processes named.
run_ns() {
  local total=0 p s a
  for p in "$@"; do
    for s in /proc/"$p"/task/*/schedstat; do
      read -r a _ < "$s" && total=$((total + a))
    done
  done
  echo "$total"
}

# Stops the gateway (pid in $gateway, if any) and the backend of folder $1.
one_route_cleanup() {
  [ -n "${gateway:-}" ] && kill -KILL "$gateway" 2>/dev/null || true
  kill "$(cat "$1/nginx.pid" 2>/dev/null)" 2>/dev/null || true
}
