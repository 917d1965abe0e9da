#!/usr/bin/env bash
# Agent image stream benchmark (DESIGN.md §10): stream a raw image from a loopback nginx
# (sendfile) to a loop device made with `losetup --direct-io=on`, sha256 on, and compare with
#   dd if=<same image file> of=<same device> bs=4M oflag=direct   (the disk's limit; target ≥ 0.90×)
#   curl <url> | dd of=<same device> bs=4M oflag=direct           (a plain streaming client)
# measured in the same run, plus the agent's peak RSS from /usr/bin/time -v (target ≤ 64 MiB).
#
# Run by hand, as root:  bench/agent-stream.sh            (4 GiB image)
#                        SIZE_GIB=1 bench/agent-stream.sh (quicker)
# Needs: nginx-light, curl, /usr/bin/time (scripts/setup), and the release musl agent:
#   cargo build --release -p vmdeploy-agent --target x86_64-unknown-linux-musl
# Scratch files go to $BENCH_DIR (default /var/tmp/vmdeploy-bench, must not be tmpfs).
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
SIZE_GIB="${SIZE_GIB:-4}"
BENCH_DIR="${BENCH_DIR:-/var/tmp/vmdeploy-bench}"
TARGET_DIR="${CARGO_TARGET_DIR:-$ROOT/target}"
AGENT="${AGENT:-$TARGET_DIR/x86_64-unknown-linux-musl/release/vmdeploy-agent}"
log() { printf '[bench] %s\n' "$*" >&2; }

[ -x "$AGENT" ] || { log "missing $AGENT (build it: see the header)"; exit 1; }
command -v nginx >/dev/null || { log "nginx missing: run scripts/setup"; exit 1; }
[ "$(id -u)" = 0 ] || { log "run as root (losetup)"; exit 1; }

mkdir -p "$BENCH_DIR/www"
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
mkdir -p "$BENCH_DIR/tmp"
nginx -c "$BENCH_DIR/nginx.conf" &
NGINX_PID=$!
URL="http://127.0.0.1:$PORT/image.raw"
for _ in $(seq 50); do curl -sfI "$URL" >/dev/null 2>&1 && break; sleep 0.1; done
curl -sfI "$URL" >/dev/null || { log "nginx did not come up"; exit 1; }

# Warm the page cache with the image so every contender reads it from memory.
cat "$IMAGE" > /dev/null

now() { date +%s.%N; }
rate() { python3 -c "print(f'{$SIZE/($2-$1)/2**20:.0f}')"; }

sync
log "dd bs=4M oflag=direct"
t0=$(now); dd if="$IMAGE" of="$LOOP" bs=4M oflag=direct status=none; t1=$(now)
DD=$(rate "$t0" "$t1")

sync
log "curl | dd oflag=direct"
t0=$(now); curl -sf "$URL" | dd of="$LOOP" bs=4M oflag=direct iflag=fullblock status=none; t1=$(now)
CURL=$(rate "$t0" "$t1")

sync
log "vmdeploy-agent write-image (sha256)"
blkdiscard -f "$LOOP" 2>/dev/null || true
t0=$(now)
/usr/bin/time -v -o "$BENCH_DIR/agent-time.txt" \
  "$AGENT" write-image --url "$URL" --disk "$LOOP" --checksum "sha256:$SUM" 2> "$BENCH_DIR/agent-stderr.txt"
t1=$(now)
AGENT_RATE=$(rate "$t0" "$t1")
RSS_KB=$(awk -F': ' '/Maximum resident set size/ {print $2}' "$BENCH_DIR/agent-time.txt")
tail -n 2 "$BENCH_DIR/agent-stderr.txt" >&2

log "checking the disk"
cmp -n "$SIZE" "$IMAGE" "$LOOP" && log "disk matches the image"

python3 - <<PY
dd, curl, agent, rss = $DD, $CURL, $AGENT_RATE, $RSS_KB
print(f"image {${SIZE_GIB}} GiB raw, sha256, loop device --direct-io=on, nginx sendfile on loopback")
print(f"dd bs=4M oflag=direct (file -> disk):  {dd:6.0f} MiB/s")
print(f"curl | dd oflag=direct:                {curl:6.0f} MiB/s   agent/curl = {agent/curl:.2f}")
print(f"vmdeploy-agent write-image:            {agent:6.0f} MiB/s   agent/dd = {agent/dd:.2f} (target >= 0.90)")
print(f"agent peak RSS: {rss/1024:.1f} MiB (target <= 64, aim <= 32)")
PY
