#!/usr/bin/env bash
# The web application firewall against nginx with ModSecurity (issue 73):
# the OWASP Core Rule Set (../shared/crs, v4.28.0, the same files) at
# paranoia 1 in blocking mode in front of nginx `return 200` (its own
# process), through each front in its own process: cutover (one
# data-plane worker, a route with `waf`) and nginx (one worker,
# `libnginx-mod-http-modsecurity`, Debian's ModSecurity 3). Two loads,
# as `benches/waf.rs` evaluates them in process: a benign GET with a
# browser's headers, and a 4 KiB URL-encoded POST of benign form fields,
# each asked by `wrk -t1 -c16` for SECONDS in ROUNDS alternating rounds
# after an unmeasured pass. Prints req/s and CPU per request (the
# scheduler's run time of every thread of the front's processes /
# requests answered), the ratios, and cutover's VmRSS with CRS loaded
# against the same configuration without it.
#
# Both run the answer's rules (phases 3 to 5). `SecResponseBodyAccess
# Off` keeps ModSecurity from reading answer bodies; cutover reads a
# text/plain, text/html or text/xml body (nginx's `return 200` here is
# text/plain, its default type: cutover's rules read its 13 bytes).
#
#   benches/waf_peers.sh [CUTOVER_BINARY] [ROUNDS] [SECONDS]
#
# Needs wrk, nginx-light, libnginx-mod-http-modsecurity, python3, curl
# (apt-get install wrk nginx-light libnginx-mod-http-modsecurity python3
# curl). Loopback only; every process it starts is stopped by pid.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
bin=${1:-$here/../target/release/cutover}
rounds=${2:-4}
seconds=${3:-8}
crs=$(cd "$here/../../shared/crs" 2>/dev/null && pwd) || { echo "needs the Core Rule Set at ../shared/crs"; exit 1; }
module=/usr/lib/nginx/modules/ngx_http_modsecurity_module.so
for tool in wrk nginx python3 curl; do
  command -v "$tool" > /dev/null || { echo "needs $tool (apt-get install wrk nginx-light python3 curl)"; exit 1; }
done
[ -f "$module" ] || { echo "needs $module (apt-get install libnginx-mod-http-modsecurity)"; exit 1; }
dir=$(mktemp -d)
chmod 755 "$dir"
. "$here/one_route.sh"
gateway=
plain=
cleanup() {
  [ -n "$plain" ] && kill -KILL "$plain" 2>/dev/null || true
  kill "$(cat "$dir/modsec-nginx.pid" 2>/dev/null)" 2>/dev/null || true
  one_route_cleanup "$dir"
  sleep 0.5
  rm -rf "$dir"
}
trap cleanup EXIT

back=$(start_backend "$dir")

# nginx with ModSecurity, the same rule files and settings.
cat > "$dir/modsec.conf" <<MS
SecRuleEngine On
SecRequestBodyAccess On
SecRequestBodyLimit 131072
SecRequestBodyNoFilesLimit 131072
SecRequestBodyLimitAction Reject
SecResponseBodyAccess Off
SecAuditEngine Off
SecDebugLogLevel 0
SecAction "id:899000,phase:1,pass,nolog,setvar:tx.blocking_paranoia_level=1,setvar:tx.inbound_anomaly_score_threshold=5"
Include $crs/crs-setup.conf.example
Include $crs/rules/*.conf
MS
modsec_port=$(free_port)
cat > "$dir/modsec-nginx.conf" <<NG
load_module $module;
worker_processes 1; pid $dir/modsec-nginx.pid; error_log $dir/modsec-nginx.err;
events { worker_connections 4096; }
http { access_log off; keepalive_requests 10000000;
  modsecurity on; modsecurity_rules_file $dir/modsec.conf;
  upstream app { server 127.0.0.1:$back; keepalive 32; }
  server { listen 127.0.0.1:$modsec_port;
    location / { proxy_pass http://app; proxy_http_version 1.1; proxy_set_header Connection ""; } } }
NG
nginx -c "$dir/modsec-nginx.conf" -e "$dir/modsec-nginx.err"

# cutover with the route's `waf`, and the same configuration without it.
port=$(free_port); admin=$(free_port)
write_gateway_config "$dir/gw.toml" "$admin" "$port" "$back"
cp "$dir/gw.toml" "$dir/plain.toml"
sed -i "s|^upstream = \"app\"\$|upstream = \"app\"\nwaf = { ruleset = \"crs\" }|" "$dir/gw.toml"
sed -i "s|^\[runtime\]\$|[runtime]\nfile_roots = [\"$crs\"]|" "$dir/gw.toml"
printf '[waf.rulesets.crs]\nfiles = ["%s/crs-setup.conf.example", "%s/rules"]\n' "$crs" "$crs" >> "$dir/gw.toml"
"$bin" run -c "$dir/gw.toml" > "$dir/gw.out" 2> "$dir/gw.err" &
gateway=$!
plain_port=$(free_port); plain_admin=$(free_port)
sed -i "s|127.0.0.1:$admin|127.0.0.1:$plain_admin|; s|127.0.0.1:$port|127.0.0.1:$plain_port|" "$dir/plain.toml"
"$bin" run -c "$dir/plain.toml" > "$dir/plain.out" 2> "$dir/plain.err" &
plain=$!

targets=("cutover 127.0.0.1:$port" "modsecurity 127.0.0.1:$modsec_port")
for t in "${targets[@]}" "plain 127.0.0.1:$plain_port"; do
  for _ in $(seq 1 200); do
    curl -s -o /dev/null "http://${t#* }/" && break
    sleep 0.05
  done
done
# Both block an attack, or the comparison means nothing.
for t in "${targets[@]}"; do
  code=$(curl -s -o /dev/null -w '%{http_code}' -A 'Mozilla/5.0' -H 'Accept: */*' "http://${t#* }/item?id=1%27%20OR%20%271%27%3D%271")
  [ "$code" = 403 ] || { echo "${t%% *} did not block an SQL injection ($code)"; cat "$dir"/*.err; exit 1; }
done

ua='Mozilla/5.0 (X11; Linux x86_64; rv:128.0) Gecko/20100101 Firefox/128.0'
cat > "$dir/get.lua" <<LUA
wrk.path = "/catalog/item/4711?color=blue&size=m&ref=newsletter"
wrk.headers["Host"] = "shop.example.com"
wrk.headers["User-Agent"] = "$ua"
wrk.headers["Accept"] = "text/html,application/xhtml+xml,application/xml;q=0.9,*/*;q=0.8"
wrk.headers["Accept-Language"] = "en-US,en;q=0.5"
wrk.headers["Accept-Encoding"] = "gzip, deflate, br"
wrk.headers["Referer"] = "https://shop.example.com/catalog?page=2"
wrk.headers["Cookie"] = "session=6f1c2a9e4b7d8e0f; theme=dark; consent=1"
LUA
cp "$dir/get.lua" "$dir/post.lua"
cat >> "$dir/post.lua" <<'LUA'
wrk.method = "POST"
wrk.path = "/checkout/address"
wrk.headers["Content-Type"] = "application/x-www-form-urlencoded"
local fields, i, size = {}, 0, 0
while size < 4096 - 64 do
  local f = string.format("field%d=Please+deliver+to+the+back+door+after+five+o%%27clock+thank+you+%d", i, i)
  fields[#fields + 1] = f
  size = size + #f + 1
  i = i + 1
end
wrk.body = table.concat(fields, "&")
LUA
# Each passes the benign loads (200), or it is not their cost measured.
for t in "${targets[@]}"; do
  for load in get post; do
    out=$(wrk -t1 -c1 -d1s -s "$dir/$load.lua" "http://${t#* }" )
    if echo "$out" | grep -q 'Non-2xx'; then echo "${t%% *} refused the benign $load:"; echo "$out"; exit 1; fi
  done
done

pids_of() {
  case $1 in
    cutover) echo "$gateway" ;;
    modsecurity) echo "$(cat "$dir/modsec-nginx.pid") $(pgrep -P "$(cat "$dir/modsec-nginx.pid")" | tr '\n' ' ')" ;;
  esac
}
rss_kib() { awk '/^VmRSS/ {print $2}' "/proc/$1/status"; }

# Memory before the loads: both have answered a handful of requests.
echo "VmRSS before the loads: cutover with CRS $(rss_kib "$gateway") KiB, the same configuration without it $(rss_kib "$plain") KiB ($(python3 -c "print(round($(rss_kib "$gateway") / $(rss_kib "$plain"), 2))") ×)"

for t in "${targets[@]}"; do
  for load in get post; do wrk -t1 -c16 -d2s -s "$dir/$load.lua" "http://${t#* }" > /dev/null; done
done

declare -A rps cpu
for round in $(seq 1 "$rounds"); do
  for load in get post; do
    for t in "${targets[@]}"; do
      name=${t%% *}; addr=${t#* }
      # shellcheck disable=SC2046
      before=$(run_ns $(pids_of "$name"))
      out=$(wrk -t1 -c16 -d"${seconds}s" -s "$dir/$load.lua" "http://$addr")
      # shellcheck disable=SC2046
      after=$(run_ns $(pids_of "$name"))
      requests=$(echo "$out" | awk '/requests in/ {print $1}')
      r=$(echo "$out" | awk '/Requests\/sec/ {print $2}')
      c=$(python3 -c "print(round(($after - $before) / 1000 / $requests, 2))")
      bad=$(echo "$out" | awk '/Non-2xx/ {print $NF}')
      echo "round $round: $load $name $r req/s, CPU $c µs/request${bad:+, $bad non-2xx}"
      rps[$name-$load]="${rps[$name-$load]:-} $r"; cpu[$name-$load]="${cpu[$name-$load]:-} $c"
    done
  done
done
median() { python3 -c "import statistics,sys; print(statistics.median(float(x) for x in sys.argv[1:]))" "$@"; }
for load in get post; do
  # shellcheck disable=SC2086
  echo "$load: cutover / modsecurity: CPU per request $(python3 -c "print(round($(median ${cpu[cutover-$load]}) / $(median ${cpu[modsecurity-$load]}), 3))"), throughput $(python3 -c "print(round($(median ${rps[cutover-$load]}) / $(median ${rps[modsecurity-$load]}), 3))") (medians of $rounds rounds: $(median ${cpu[cutover-$load]}) and $(median ${cpu[modsecurity-$load]}) µs)"
done
echo "VmRSS after the loads: cutover with CRS $(rss_kib "$gateway") KiB"
