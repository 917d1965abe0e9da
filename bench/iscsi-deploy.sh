#!/usr/bin/env bash
# iscsi_ilo deploy benchmark, run by hand, not in CI.
#
# Measures an iscsi_ilo deploy from the ramdisk's pass_deploy_info to `active` for a 1 GiB raw
# image, next to the conductor's initiator writing the same image raw
# (`vmdeploy-conductor iscsi write`) into the same kind of target in the same run, and prints
# both times and the ratio deploy / raw write (the deploy should cost little beyond the write).
#
# Both sides, release builds, on fresh sparse `losetup --direct-io=on` disks in /var/tmp:
#   raw write : vmdeploy-conductor iscsi write IMAGE -> vmdeploy-agent iscsi-target
#   deploy    : the real Manager and iscsi_ilo flow (in-process, release), the iLO emulator, the
#               built-in object store and the conductor's API router; the ramdisk is played by
#               vmdeploy-agent iscsi-target and the call-back posted by the measurement, so the
#               clock runs from pass_deploy_info (202) to `active` (log in, write from the image
#               cache, read back, done, boot device, power cycle).
# A first deploy fills the conductor's image cache and is reported apart ("cold cache"); the
# medians are over RUNS warm runs. The measurement is the example program
# tests/integration/examples/iscsi_deploy_bench.rs; every deploy is checked (whole-disk images
# byte for byte).
#
# Usage: bench/iscsi-deploy.sh [--partition | --whole-disk]
#   --partition  (default) a raw partition image: an ext4 file system of SIZE_MB filled with
#                random data, deployed as the root partition (netboot: the boot ISO is built
#                from KERNEL and RAMDISK);
#   --whole-disk a raw whole-disk image of SIZE_MB random bytes.
#
# Environment: RUNS (default 3), SIZE_MB (1024), WORK (scratch directory, default
# /var/tmp/vmdeploy-iscsi-deploy-bench), BUILD=0 to use binaries already built, PROFILE (cargo
# profile, default release), CARGO_TARGET_DIR (as cargo), KERNEL and RAMDISK (partition images;
# default: small stand-in files, the boot ISO is built but never booted here).
# Needs root (losetup). Run it alone: integration tests use the same loop devices and CPUs
# (flock /tmp/vmdeploy-heavy.lock bench/iscsi-deploy.sh).
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
KIND=partition
for arg in "$@"; do
  case "$arg" in
    --partition) KIND=partition ;;
    --whole-disk) KIND=whole-disk ;;
    -h|--help) sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
    *) echo "unknown argument $arg (--partition or --whole-disk)" >&2; exit 64 ;;
  esac
done
RUNS="${RUNS:-3}"
SIZE_MB="${SIZE_MB:-1024}"
WORK="${WORK:-/var/tmp/vmdeploy-iscsi-deploy-bench}"
PROFILE="${PROFILE:-release}"
TARGET_DIR="${CARGO_TARGET_DIR:-$ROOT/target}"

[ "$(id -u)" = 0 ] || { echo "run as root (the disks are loop devices: losetup)" >&2; exit 1; }
tools=(losetup python3)
[ "$KIND" = partition ] && tools+=(mke2fs)
for tool in "${tools[@]}"; do
  command -v "$tool" >/dev/null || { echo "missing $tool (scripts/setup installs it)" >&2; exit 1; }
done

cargo_profile=(--profile "$PROFILE")
if [ "${BUILD:-1}" = 1 ]; then
  (cd "$ROOT" && cargo build "${cargo_profile[@]}" -p vmdeploy-conductor -p vmdeploy-agent \
    -p vmdeploy-ilo-emulator -p vmdeploy-image-build --bins)
  (cd "$ROOT" && cargo build "${cargo_profile[@]}" -p vmdeploy-integration-tests \
    --example iscsi_deploy_bench)
fi
bindir="$TARGET_DIR/$([ "$PROFILE" = dev ] && echo debug || echo "$PROFILE")"
for b in vmdeploy-conductor vmdeploy-agent ilo-emulator vmdeploy-image-build examples/iscsi_deploy_bench; do
  [ -x "$bindir/$b" ] || { echo "$bindir/$b missing (run without BUILD=0)" >&2; exit 1; }
done

mkdir -p "$WORK"
IMAGE="$WORK/$KIND.img"
if [ ! -f "$IMAGE" ] || [ "$(stat -c %s "$IMAGE")" -ne $((SIZE_MB * 1048576)) ]; then
  echo "creating $IMAGE ($SIZE_MB MiB, $KIND)" >&2
  rm -f "$IMAGE"
  if [ "$KIND" = whole-disk ]; then
    head -c $((SIZE_MB * 1048576)) /dev/urandom > "$IMAGE"
  else
    # An ext4 root file system filled (but for its metadata's share) with one random file:
    # dense, as a raw root image of an installed system mostly is.
    rm -rf "$WORK/rootfs" && mkdir -p "$WORK/rootfs"
    # (An eighth and 8 MiB left for the journal and inode tables.)
    head -c $(( (SIZE_MB - SIZE_MB / 8 - 8) * 1048576 )) /dev/urandom > "$WORK/rootfs/payload"
    mke2fs -q -F -t ext4 -m 0 -L bench-root -d "$WORK/rootfs" "$IMAGE" "${SIZE_MB}M"
    rm -rf "$WORK/rootfs"
  fi
fi
if [ "$KIND" = partition ]; then
  KERNEL="${KERNEL:-$WORK/vmlinuz}"
  RAMDISK="${RAMDISK:-$WORK/initrd}"
  # A stand-in kernel: random bytes with the x86 boot header the ISO writer checks ("HdrS").
  [ -f "$KERNEL" ] || python3 -c 'import os,sys; k=bytearray(os.urandom(8<<20)); k[0x202:0x206]=b"HdrS"; open(sys.argv[1],"wb").write(k)' "$KERNEL"
  [ -f "$RAMDISK" ] || head -c $((32 * 1048576)) /dev/urandom > "$RAMDISK"
fi
cat "$IMAGE" > /dev/null   # both writers read the image from the page cache

echo "iscsi_ilo deploy bench: $KIND image of $SIZE_MB MiB, $RUNS runs, $PROFILE build; load average: $(cut -d' ' -f1-3 /proc/loadavg)"
out="$WORK/bench.out"
(cd "$ROOT" && \
  VMDEPLOY_BIN_DIR="$bindir" VMDEPLOY_BENCH_IMAGE="$IMAGE" VMDEPLOY_BENCH_KIND="$KIND" \
  VMDEPLOY_BENCH_RUNS="$RUNS" VMDEPLOY_BENCH_KERNEL="${KERNEL:-}" VMDEPLOY_BENCH_RAMDISK="${RAMDISK:-}" \
  RUST_LOG="${RUST_LOG:-warn}" "$bindir/examples/iscsi_deploy_bench") > "$out" 2>&1 || {
  echo "the measurement failed; its output:" >&2
  tail -n 60 "$out" >&2
  exit 1
}
grep '^BENCH ' "$out" | sed 's/^BENCH //'
echo "load average after: $(cut -d' ' -f1-3 /proc/loadavg)"
