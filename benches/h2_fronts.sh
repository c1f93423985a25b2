# Sourced by benches/syscalls.sh and benches/callgrind_peers.sh: the
# three HTTP/2 fronts they compare (cutover, HAProxy, nginx), each
# listening h2c by prior knowledge and TLS 1.3 with ALPN h2 in front of
# one backend, and what both need to start them. Needs one_route.sh.

# Waits (at most 30 s) for something to listen on loopback port $1.
wait_port() {
  for _ in $(seq 300); do
    (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null && return 0
    sleep 0.1
  done
  echo "nothing listens on $1" >&2
  exit 1
}

# A self-signed P-256 certificate for localhost in folder $1: cert.pem,
# key.pem, and combined.pem (both, for HAProxy).
make_cert() {
  openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes -days 1 \
    -subj /CN=localhost -addext subjectAltName=DNS:localhost \
    -keyout "$1/key.pem" -out "$1/cert.pem" 2>/dev/null
  cat "$1/cert.pem" "$1/key.pem" >"$1/combined.pem"
}

# cutover_h2_config DIR ADMIN PLAIN SECURE BACKEND [WORKERS]: DIR/cutover.toml.
cutover_h2_config() {
  local workers=
  [ -n "${6:-}" ] && workers=$(printf '[runtime]\nworker_threads = %s' "$6")
  cat >"$1/cutover.toml" <<CONF
[admin]
bind = "127.0.0.1:$2"
[log]
level = "warn"
access = false
$workers
[[listeners]]
name = "web"
bind = "127.0.0.1:$3"
[[listeners]]
name = "secure"
bind = "127.0.0.1:$4"
protocol = "https"
tls.certificates = [{ cert = "$1/cert.pem", key = "$1/key.pem" }]
[[routes]]
name = "all"
listeners = ["web", "secure"]
upstream = "app"
[upstreams.app]
backends = [{ addr = "127.0.0.1:$5" }]
CONF
}

# haproxy_h2_config DIR PLAIN SECURE BACKEND THREADS: DIR/haproxy.cfg.
haproxy_h2_config() {
  cat >"$1/haproxy.cfg" <<CONF
global
  nbthread $5
  maxconn 4096
  ssl-default-bind-options ssl-min-ver TLSv1.3
defaults
  mode http
  timeout connect 5s
  timeout client 30s
  timeout server 30s
  option http-keep-alive
frontend fe
  bind 127.0.0.1:$2 proto h2
  bind 127.0.0.1:$3 ssl crt $1/combined.pem alpn h2,http/1.1
  default_backend be
backend be
  http-reuse always
  server s1 127.0.0.1:$4
CONF
}

# nginx_h2_config DIR PLAIN SECURE BACKEND WORKERS: DIR/front-nginx.conf;
# WORKERS 0 runs it without its master, in one process.
nginx_h2_config() {
  local processes="worker_processes $5;"
  [ "$5" = 0 ] && processes="master_process off;"
  cat >"$1/front-nginx.conf" <<CONF
daemon off;
$processes
error_log $1/front-nginx-error.log;
pid $1/front-nginx.pid;
events { worker_connections 4096; }
http {
  access_log off;
  keepalive_requests 10000000;
  client_body_temp_path $1;
  proxy_temp_path $1;
  ssl_protocols TLSv1.3;
  upstream backend { server 127.0.0.1:$4; keepalive 128; }
  server {
    listen 127.0.0.1:$2 http2;
    listen 127.0.0.1:$3 ssl http2;
    ssl_certificate $1/cert.pem;
    ssl_certificate_key $1/key.pem;
    location / { proxy_pass http://backend; proxy_http_version 1.1; proxy_set_header Connection ""; }
  }
}
CONF
}
