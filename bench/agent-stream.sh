#!/usr/bin/env bash
# Agent image stream benchmark (docs/architecture.md §10): stream a raw image from a loopback nginx
# (sendfile) to a loop device made with `losetup --direct-io=on`, once with sha256 and once without
# a checksum, and compare in the same run with
#   dd if=<same image file> of=<same device> bs=4M oflag=direct   (the disk's limit)
#   openssl speed -bytes 4194304 -seconds 3 sha256              (one core's SHA-256: the hash's limit)
#   curl <url> | dd of=<same device> bs=4M oflag=direct           (a plain streaming client)
#   ironic-python-agent's own streaming writer (the peer), driven on the same URL and device
# A single stream cannot be hashed faster than one core does it, so the agent's limit is the
# slower of dd and the hash; the target is agent/limit ≥ 0.90. Without a checksum nothing but the
# disk limits the agent, which keeps two writes in flight where dd has one: the target is
# agent/dd ≥ 1.0. Both ratios are printed side by side. The hash is measured on 4 MiB
# blocks in memory (the agent's block size), single-threaded, for about as many bytes as the
# image: `openssl dgst` over the file would also count its small reads from the page cache.
# Each contender runs ROUNDS times, interleaved (dd, curl|dd, IPA, agent, agent without checksum,
# dd, ...), the device
# discarded before every run so each starts from the same state; medians are reported. Peak RSS
# of the agent and of IPA comes from /usr/bin/time -v. The disk is compared with the image after
# every agent run.
#
# Run by hand, as root:  bench/agent-stream.sh                     (4 GiB image, 3 rounds)
#                        SIZE_GIB=1 ROUNDS=2 bench/agent-stream.sh  (quicker)
#                        SKIP_IPA=1 bench/agent-stream.sh           (without the IPA peer)
# Needs: nginx-light, curl, openssl, /usr/bin/time (scripts/setup), python3-venv, and the release
# musl agent:
#   cargo build --release -p vmdeploy-agent --target x86_64-unknown-linux-musl
# IPA is pip-installed into $ROOT/.cache/bench-ipa-venv on first use (not part of scripts/setup).
# Scratch files go to $BENCH_DIR (default /var/tmp/vmdeploy-bench, must not be tmpfs).
# The machine's load matters (2 cores): the load average is printed before and after.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
SIZE_GIB="${SIZE_GIB:-4}"
ROUNDS="${ROUNDS:-3}"
SKIP_IPA="${SKIP_IPA:-0}"
BENCH_DIR="${BENCH_DIR:-/var/tmp/vmdeploy-bench}"
TARGET_DIR="${CARGO_TARGET_DIR:-$ROOT/target}"
AGENT="${AGENT:-$TARGET_DIR/x86_64-unknown-linux-musl/release/vmdeploy-agent}"
IPA_VENV="${IPA_VENV:-$ROOT/.cache/bench-ipa-venv}"
log() { printf '[bench] %s\n' "$*" >&2; }

[ -x "$AGENT" ] || { log "missing $AGENT (build it: see the header)"; exit 1; }
command -v nginx >/dev/null || { log "nginx missing: run scripts/setup"; exit 1; }
command -v openssl >/dev/null || { log "openssl missing: apt-get install openssl"; exit 1; }
[ "$(id -u)" = 0 ] || { log "run as root (losetup)"; exit 1; }

if [ "$SKIP_IPA" != 1 ] && [ ! -x "$IPA_VENV/bin/python" ]; then
  log "installing ironic-python-agent into $IPA_VENV"
  python3 -m venv "$IPA_VENV"
  "$IPA_VENV/bin/pip" install -q ironic-python-agent
fi

mkdir -p "$BENCH_DIR/www" "$BENCH_DIR/tmp"
IMAGE="$BENCH_DIR/www/image.raw"
DISK_FILE="$BENCH_DIR/disk.img"
SIZE=$((SIZE_GIB * 1024 * 1024 * 1024))
LOOP=""
NGINX_PID=""
cleanup() {
  [ -n "$NGINX_PID" ] && kill "$NGINX_PID" 2>/dev/null || true
  [ -n "$LOOP" ] && losetup -d "$LOOP" 2>/dev/null || true
  rm -f "$DISK_FILE"
}
trap cleanup EXIT

if [ "$(stat -c %s "$IMAGE" 2>/dev/null || echo 0)" != "$SIZE" ]; then
  log "making a ${SIZE_GIB} GiB random image"
  dd if=/dev/urandom of="$IMAGE" bs=4M count=$((SIZE_GIB * 256)) status=none
fi
log "sha256 of the image"
SUM=$(sha256sum "$IMAGE" | cut -d' ' -f1)

# The disk: a file on disk behind a direct-io loop device (writes reach the file, not the cache).
truncate -s 0 "$DISK_FILE"
fallocate -l $((SIZE + 64 * 1024 * 1024)) "$DISK_FILE"
LOOP=$(losetup --find --show --direct-io=on "$DISK_FILE")
log "disk $LOOP (direct-io) over $DISK_FILE"

# nginx on an ephemeral loopback port, sendfile on.
PORT=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
cat > "$BENCH_DIR/nginx.conf" <<NGINX
daemon off;
worker_processes 1;
pid $BENCH_DIR/nginx.pid;
error_log $BENCH_DIR/nginx-error.log;
events { worker_connections 16; }
http {
  access_log off;
  sendfile on;
  tcp_nopush on;
  client_body_temp_path $BENCH_DIR/tmp;
  proxy_temp_path $BENCH_DIR/tmp;
  fastcgi_temp_path $BENCH_DIR/tmp;
  uwsgi_temp_path $BENCH_DIR/tmp;
  scgi_temp_path $BENCH_DIR/tmp;
  server { listen 127.0.0.1:$PORT; root $BENCH_DIR/www; }
}
NGINX
nginx -c "$BENCH_DIR/nginx.conf" &
NGINX_PID=$!
URL="http://127.0.0.1:$PORT/image.raw"
for _ in $(seq 50); do curl -sfI "$URL" >/dev/null 2>&1 && break; sleep 0.1; done
curl -sfI "$URL" >/dev/null || { log "nginx did not come up"; exit 1; }

# IPA's real streaming writer: StandbyExtension._stream_raw_image_onto_device (ImageDownload:
# requests, 1 MiB chunks hashed with hashlib, buffered writes to the device, verify at the end).
# Only the GPT fix-up and root-UUID lookup that follow the stream (sgdisk/blkid on the written
# image; a random image has neither) are stubbed out. The stream call alone is timed.
cat > "$BENCH_DIR/ipa_stream.py" <<'PY'
import sys, time
from oslo_config import cfg
from ironic_python_agent import config, disk_utils
from ironic_python_agent.extensions import standby
config.populate_config()
cfg.CONF([], project="ironic-python-agent")  # defaults: 60 s timeouts, 2 retries
disk_utils.fix_gpt_partition = lambda *a, **k: None
disk_utils.block_uuid = lambda *a, **k: None
url, device, sha, out = sys.argv[1:5]
ext = standby.StandbyExtension()
ext.partition_uuids = {}
info = {"id": "bench", "urls": [url], "disk_format": "raw", "stream_raw_images": True,
        "os_hash_algo": "sha256", "os_hash_value": sha}
t0 = time.monotonic()
ext._stream_raw_image_onto_device(info, device)
t1 = time.monotonic()
with open(out, "w") as f:
    f.write(f"{t0} {t1}\n")
PY

# Warm the page cache with the image so every contender reads it from memory.
cat "$IMAGE" > /dev/null

now() { date +%s.%N; }
fresh_disk() { sync; blkdiscard -f "$LOOP" >/dev/null 2>&1 || true; }
rss_kb() { awk -F': ' '/Maximum resident set size/ {print $2}' "$1"; }
# User + system CPU seconds of a /usr/bin/time -v report: what the contender costs, whatever the load.
cpu_s() { awk -F': ' '/User time|System time/ {s += $2} END {print s}' "$1"; }
DD_T=() HASH_K=() CURL_T=() AGENT_T=() IPA_T=() AGENT_RSS=() IPA_RSS=() AGENT_CPU=() IPA_CPU=()
PLAIN_T=() PLAIN_RSS=()

log "load before: $(cut -d' ' -f1-3 /proc/loadavg)"
LOAD_BEFORE=$(cut -d' ' -f1-3 /proc/loadavg)
for round in $(seq "$ROUNDS"); do
  log "round $round/$ROUNDS: dd bs=4M oflag=direct"
  fresh_disk
  t0=$(now); dd if="$IMAGE" of="$LOOP" bs=4M oflag=direct status=none; t1=$(now)
  DD_T+=("$t0 $t1")

  log "round $round/$ROUNDS: openssl speed sha256 (one core, 4 MiB blocks)"
  # The last line reads "sha256  <thousands of bytes per second>k".
  k=$(openssl speed -bytes 4194304 -seconds 3 sha256 2>/dev/null | awk '$1 == "sha256" {sub(/k$/, "", $2); print $2}')
  [ -n "$k" ] || { log "openssl speed printed no sha256 figure"; exit 1; }
  HASH_K+=("$k")

  log "round $round/$ROUNDS: curl | dd oflag=direct"
  fresh_disk
  t0=$(now); curl -sf "$URL" | dd of="$LOOP" bs=4M oflag=direct iflag=fullblock status=none; t1=$(now)
  CURL_T+=("$t0 $t1")

  if [ "$SKIP_IPA" != 1 ]; then
    log "round $round/$ROUNDS: ironic-python-agent stream (sha256)"
    fresh_disk
    /usr/bin/time -v -o "$BENCH_DIR/ipa-time.txt" "$IPA_VENV/bin/python" "$BENCH_DIR/ipa_stream.py" \
      "$URL" "$LOOP" "$SUM" "$BENCH_DIR/ipa-span.txt" 2> "$BENCH_DIR/ipa-stderr.txt" \
      || { tail -n 20 "$BENCH_DIR/ipa-stderr.txt" >&2; log "IPA failed"; exit 1; }
    IPA_T+=("$(cat "$BENCH_DIR/ipa-span.txt")")
    IPA_RSS+=("$(rss_kb "$BENCH_DIR/ipa-time.txt")")
    IPA_CPU+=("$(cpu_s "$BENCH_DIR/ipa-time.txt")")
  fi

  log "round $round/$ROUNDS: vmdeploy-agent write-image (sha256)"
  fresh_disk
  t0=$(now)
  /usr/bin/time -v -o "$BENCH_DIR/agent-time.txt" \
    "$AGENT" write-image --url "$URL" --disk "$LOOP" --checksum "sha256:$SUM" 2> "$BENCH_DIR/agent-stderr.txt" \
    || { tail -n 20 "$BENCH_DIR/agent-stderr.txt" >&2; log "agent failed"; exit 1; }
  t1=$(now)
  AGENT_T+=("$t0 $t1")
  AGENT_RSS+=("$(rss_kb "$BENCH_DIR/agent-time.txt")")
  AGENT_CPU+=("$(cpu_s "$BENCH_DIR/agent-time.txt")")
  tail -n 1 "$BENCH_DIR/agent-stderr.txt" >&2
  cmp -n "$SIZE" "$IMAGE" "$LOOP" || { log "the disk does not match the image after the agent"; exit 1; }
  log "disk matches the image"

  log "round $round/$ROUNDS: vmdeploy-agent write-image (no checksum)"
  fresh_disk
  t0=$(now)
  /usr/bin/time -v -o "$BENCH_DIR/agent-time.txt" \
    "$AGENT" write-image --url "$URL" --disk "$LOOP" 2> "$BENCH_DIR/agent-stderr.txt" \
    || { tail -n 20 "$BENCH_DIR/agent-stderr.txt" >&2; log "agent failed"; exit 1; }
  t1=$(now)
  PLAIN_T+=("$t0 $t1")
  PLAIN_RSS+=("$(rss_kb "$BENCH_DIR/agent-time.txt")")
  tail -n 1 "$BENCH_DIR/agent-stderr.txt" >&2
  cmp -n "$SIZE" "$IMAGE" "$LOOP" || { log "the disk does not match the image after the agent"; exit 1; }
  log "disk matches the image"
done
LOAD_AFTER=$(cut -d' ' -f1-3 /proc/loadavg)
log "load after: $LOAD_AFTER"

join() { local IFS=,; echo "$*"; }
python3 - "$SIZE" "$SIZE_GIB" "$ROUNDS" "$LOAD_BEFORE" "$LOAD_AFTER" \
  "$(join "${DD_T[@]}")" "$(join "${HASH_K[@]}")" "$(join "${CURL_T[@]}")" "$(join "${AGENT_T[@]}")" \
  "$(join "${IPA_T[@]+"${IPA_T[@]}"}")" "$(join "${AGENT_RSS[@]}")" "$(join "${IPA_RSS[@]+"${IPA_RSS[@]}"}")" \
  "$(join "${AGENT_CPU[@]}")" "$(join "${IPA_CPU[@]+"${IPA_CPU[@]}"}")" \
  "$(join "${PLAIN_T[@]}")" "$(join "${PLAIN_RSS[@]}")" <<'PY'
import statistics, sys
size, gib, rounds, load0, load1 = int(sys.argv[1]), sys.argv[2], sys.argv[3], sys.argv[4], sys.argv[5]
def rates(arg):
    out = []
    for span in filter(None, arg.split(",")):
        t0, t1 = map(float, span.split())
        out.append(size / (t1 - t0) / 2**20)
    return out
def kbs(arg):
    return [int(x) for x in arg.split(",") if x]
dd, curl, agent, ipa = (rates(a) for a in (sys.argv[6], *sys.argv[8:11]))
sha = [float(k) * 1000 / 2**20 for k in sys.argv[7].split(",") if k]
agent_rss, ipa_rss = kbs(sys.argv[11]), kbs(sys.argv[12])
agent_cpu, ipa_cpu = ([float(x) for x in a.split(",") if x] for a in sys.argv[13:15])
plain, plain_rss = rates(sys.argv[15]), kbs(sys.argv[16])
med = statistics.median
fmt = lambda rs: " ".join(f"{r:.0f}" for r in rs)
print(f"image {gib} GiB raw, sha256, loop device --direct-io=on (discarded before each run), "
      f"nginx sendfile on loopback; {rounds} interleaved rounds, medians")
print(f"load average before: {load0}; after: {load1}")
print(f"dd bs=4M oflag=direct (file -> disk): {med(dd):6.0f} MiB/s   [{fmt(dd)}]")
print(f"openssl speed sha256 (one core):      {med(sha):6.0f} MiB/s   [{fmt(sha)}]")
print(f"curl | dd oflag=direct:               {med(curl):6.0f} MiB/s   [{fmt(curl)}]")
if ipa:
    print(f"ironic-python-agent stream:           {med(ipa):6.0f} MiB/s   [{fmt(ipa)}]")
print(f"vmdeploy-agent write-image:           {med(agent):6.0f} MiB/s   [{fmt(agent)}]")
print(f"vmdeploy-agent, no checksum:          {med(plain):6.0f} MiB/s   [{fmt(plain)}]")
limit = min(med(dd), med(sha))
print(f"limit = the slower of dd and the hash = {limit:.0f} MiB/s "
      f"({'the hash' if med(sha) < med(dd) else 'the disk'})")
print(f"agent/limit = {med(agent)/limit:.2f} (target >= 0.90)")
print(f"agent/dd   = {med(agent)/med(dd):.2f}   agent/sha256 = {med(agent)/med(sha):.2f}")
print(f"agent/curl = {med(agent)/med(curl):.2f}")
print(f"no checksum: agent/dd = {med(plain)/med(dd):.2f} (target >= 1.0)")
print(f"ratios side by side: sha256 agent/limit = {med(agent)/limit:.2f} (>= 0.90), "
      f"no checksum agent/dd = {med(plain)/med(dd):.2f} (>= 1.0)")
if ipa:
    print(f"agent/IPA  = {med(agent)/med(ipa):.2f}   (IPA/dd = {med(ipa)/med(dd):.2f})")
rss = agent_rss + plain_rss
print(f"agent peak RSS: {max(rss)/1024:.1f} MiB (max of {len(rss)} runs; target <= 64, aim <= 32)")
if ipa_rss:
    print(f"IPA peak RSS:   {max(ipa_rss)/1024:.1f} MiB (python process, max of {len(ipa_rss)} runs)")
per_gib = lambda cs: med(cs) / (size / 2**30)
print(f"CPU per GiB (user+sys, median): agent {per_gib(agent_cpu):.2f} s"
      + (f", IPA {per_gib(ipa_cpu):.2f} s (whole python process)" if ipa_cpu else ""))
PY
