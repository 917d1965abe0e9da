#!/usr/bin/env bash
# iSCSI write benchmark (docs/architecture.md §10), run by hand, not in CI.
#
# Writes the same 1 GiB random image over loopback to an O_DIRECT file-backed LUN three ways, in
# the same run, on the same filesystem, and prints the throughput and the ratios:
#   ours : vmdeploy-conductor iscsi write  ->  vmdeploy-agent iscsi-target (O_DIRECT)
#   tgtd : qemu-img convert -n -m 16 -W (libiscsi)  ->  tgtd tuned as in
#          docs/iscsi-and-swift-peers.md §3 (256 KiB PDUs, FirstBurst 256 KiB, MaxBurst 1 MiB,
#          InitialR2T=No) with --bsoflags direct
#   fio  : fio --rw=write --bs=4M --iodepth=8 --direct=1 --ioengine=libaio on a file of the same
#          size on the same filesystem: the disk's limit (docs/architecture.md §10; dd keeps one write in
#          flight and understates the disk)
#   dd   : dd bs=4M oflag=direct from the image file (kept for comparison with earlier runs)
# and, to tell the initiator's share from the target's, our initiator -> the same tuned tgtd.
# Targets: ours >= 1.0x tgtd (tgtd runs near this disk's limit, so the fio row binds) and
# ours >= 0.85x fio. Every copy is checked with cmp afterwards (fio writes its own data, not the
# image).
#
# Environment: RUNS (default 3; medians are reported), SIZE_MB (1024), WORK (scratch directory,
# default /var/tmp/vmdeploy-iscsi-bench), BUILD=0 to use binaries already built,
# PROFILE (cargo profile, default release), CARGO_TARGET_DIR (as cargo).
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
RUNS="${RUNS:-3}"
SIZE_MB="${SIZE_MB:-1024}"
WORK="${WORK:-/var/tmp/vmdeploy-iscsi-bench}"
PROFILE="${PROFILE:-release}"
TARGET_DIR="${CARGO_TARGET_DIR:-$ROOT/target}"
IQN="iqn.2024-01.org.vmdeploy:bench"

for tool in tgtd tgtadm qemu-img dd fio cmp fallocate python3; do
  command -v "$tool" >/dev/null || { echo "missing $tool (scripts/setup installs it)" >&2; exit 1; }
done

if [ "${BUILD:-1}" = 1 ]; then
  (cd "$ROOT" && cargo build --profile "$PROFILE" -p vmdeploy-conductor -p vmdeploy-agent --bins)
fi
bindir="$TARGET_DIR/$([ "$PROFILE" = dev ] && echo debug || echo "$PROFILE")"
CONDUCTOR="$bindir/vmdeploy-conductor"
AGENT="$bindir/vmdeploy-agent"
[ -x "$CONDUCTOR" ] && [ -x "$AGENT" ] || { echo "binaries missing in $bindir" >&2; exit 1; }

mkdir -p "$WORK"
free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
now() { date +%s.%N; }
mbps() { python3 -c "import sys; print(f'{$SIZE_MB*1048576/($2-$1)/1e6:.0f}')" "$@"; }

TGT_PORT="$(free_port)"
TGT_CTL=$(( TGT_PORT % 32000 + 1 ))   # tgtd takes control ports 0..32767
while tgtadm -C "$TGT_CTL" --mode sys --op show >/dev/null 2>&1; do TGT_CTL=$(( TGT_CTL % 32000 + 1 )); done
TGT_PID=""
AGENT_PID=""
cleanup() {
  if [ -n "$TGT_PID" ]; then
    tgtadm -C "$TGT_CTL" --lld iscsi --mode target --op delete --force --tid 1 >/dev/null 2>&1 || true
    kill -KILL "$TGT_PID" 2>/dev/null || true   # tgtd ignores SIGTERM (docs/iscsi-and-swift-peers.md §1)
    wait "$TGT_PID" 2>/dev/null || true
  fi
  if [ -n "$AGENT_PID" ]; then
    kill -TERM "$AGENT_PID" 2>/dev/null || true
    wait "$AGENT_PID" 2>/dev/null || true
  fi
  rm -f "$WORK"/lun-*.img "$WORK"/dd.img "$WORK"/fio.img
}
trap cleanup EXIT

SRC="$WORK/src.img"
if [ ! -f "$SRC" ] || [ "$(stat -c %s "$SRC")" -ne $((SIZE_MB * 1048576)) ]; then
  echo "creating $SRC ($SIZE_MB MiB random)" >&2
  head -c $((SIZE_MB * 1048576)) /dev/urandom > "$SRC"
fi
cat "$SRC" > /dev/null   # every writer reads the image from the page cache

fresh() { rm -f "$1"; fallocate -l $((SIZE_MB * 1048576)) "$1"; }
# The cmp checks pull a LUN file into the page cache; O_DIRECT writes over cached pages pay for
# invalidating them. Drop them before every timed write so all three writers start alike.
uncache() { python3 -c 'import os,sys; fd=os.open(sys.argv[1],os.O_RDONLY); os.posix_fadvise(fd,0,0,os.POSIX_FADV_DONTNEED)' "$1"; }

# tgtd, tuned, O_DIRECT LUN.
fresh "$WORK/lun-tgtd.img"
tgtd -f -C "$TGT_CTL" --iscsi portal=127.0.0.1:"$TGT_PORT" > "$WORK/tgtd.log" 2>&1 &
TGT_PID=$!
for _ in $(seq 100); do tgtadm -C "$TGT_CTL" --mode sys --op show >/dev/null 2>&1 && break; sleep 0.05; done
A=(tgtadm -C "$TGT_CTL" --lld iscsi)
"${A[@]}" --mode target --op new --tid 1 --targetname "$IQN"
"${A[@]}" --mode logicalunit --op new --tid 1 --lun 1 --backing-store "$WORK/lun-tgtd.img" --bsoflags direct
"${A[@]}" --mode target --op bind --tid 1 --initiator-address 127.0.0.1
for kv in MaxRecvDataSegmentLength=262144 MaxXmitDataSegmentLength=262144 \
          FirstBurstLength=262144 MaxBurstLength=1048576 InitialR2T=No ImmediateData=Yes; do
  "${A[@]}" --mode target --op update --tid 1 --name "${kv%%=*}" --value "${kv#*=}"
done

# Ours: the agent's target on an O_DIRECT file.
AGENT_PORT="$(free_port)"
fresh "$WORK/lun-ours.img"
RUST_LOG=warn "$AGENT" iscsi-target --disk "$WORK/lun-ours.img" --iqn "$IQN" \
  --listen 127.0.0.1:"$AGENT_PORT" --done-listen 127.0.0.1:"$(free_port)" > "$WORK/agent.log" 2>&1 &
AGENT_PID=$!
for _ in $(seq 200); do (exec 3<>/dev/tcp/127.0.0.1/"$AGENT_PORT") 2>/dev/null && break; sleep 0.05; done

declare -a R_OURS R_TGTD R_DD R_FIO R_MIX
for run in $(seq "$RUNS"); do
  uncache "$WORK/lun-ours.img"
  t0=$(now)
  RUST_LOG=warn "$CONDUCTOR" iscsi write "$SRC" --portal 127.0.0.1:"$AGENT_PORT" --iqn "$IQN" >/dev/null
  t1=$(now)
  R_OURS+=("$(mbps "$t0" "$t1")")
  cmp "$SRC" "$WORK/lun-ours.img" || { echo "ours: data differs" >&2; exit 1; }

  uncache "$WORK/lun-tgtd.img"
  t0=$(now)
  qemu-img convert -n -f raw -O raw -m 16 -W "$SRC" "iscsi://127.0.0.1:$TGT_PORT/$IQN/1"
  t1=$(now)
  R_TGTD+=("$(mbps "$t0" "$t1")")
  cmp "$SRC" "$WORK/lun-tgtd.img" || { echo "tgtd: data differs" >&2; exit 1; }

  uncache "$WORK/lun-tgtd.img"
  t0=$(now)
  RUST_LOG=warn "$CONDUCTOR" iscsi write "$SRC" --portal 127.0.0.1:"$TGT_PORT" --iqn "$IQN" >/dev/null
  t1=$(now)
  R_MIX+=("$(mbps "$t0" "$t1")")
  cmp "$SRC" "$WORK/lun-tgtd.img" || { echo "ours->tgtd: data differs" >&2; exit 1; }

  fresh "$WORK/dd.img"
  t0=$(now)
  dd if="$SRC" of="$WORK/dd.img" bs=4M oflag=direct conv=notrunc status=none
  t1=$(now)
  R_DD+=("$(mbps "$t0" "$t1")")
  cmp "$SRC" "$WORK/dd.img" || { echo "dd: data differs" >&2; exit 1; }
  rm -f "$WORK/dd.img"

  fresh "$WORK/fio.img"
  t0=$(now)
  fio --name=limit --filename="$WORK/fio.img" --rw=write --bs=4M --iodepth=8 --direct=1 \
    --ioengine=libaio --size=$((SIZE_MB * 1048576)) --output=/dev/null
  t1=$(now)
  R_FIO+=("$(mbps "$t0" "$t1")")
  rm -f "$WORK/fio.img"
  echo "run $run: ours ${R_OURS[-1]} MB/s, tgtd+qemu-img ${R_TGTD[-1]} MB/s, fio ${R_FIO[-1]} MB/s, dd ${R_DD[-1]} MB/s, our initiator->tgtd ${R_MIX[-1]} MB/s"
done

median() { printf '%s\n' "$@" | sort -n | awk '{a[NR]=$1} END {print (NR%2 ? a[(NR+1)/2] : (a[NR/2]+a[NR/2+1])/2)}'; }
OURS=$(median "${R_OURS[@]}"); TGTD=$(median "${R_TGTD[@]}"); DD=$(median "${R_DD[@]}")
MIX=$(median "${R_MIX[@]}"); FIO=$(median "${R_FIO[@]}")
python3 - "$OURS" "$TGTD" "$DD" "$MIX" "$FIO" <<'EOF'
import sys
ours, tgtd, dd, mix, fio = map(float, sys.argv[1:])
print(f"median MB/s: ours {ours:.0f}, tgtd+qemu-img {tgtd:.0f}, fio {fio:.0f}, dd {dd:.0f}, our initiator->tgtd {mix:.0f}")
print(f"our initiator vs qemu-img, both into tgtd = {mix/tgtd:.2f}")
print(f"ours / tgtd = {ours/tgtd:.2f}  (target >= 1.0)")
print(f"ours / fio  = {ours/fio:.2f}  (target >= 0.85; fio is the disk's limit)")
print(f"ours / dd   = {ours/dd:.2f}")
EOF
