#!/usr/bin/env bash
# End-to-end benchmark (issue 13, DESIGN.md §10), run by hand, not in CI.
#
# Through the end-to-end lab (tests/integration/src/e2e.rs: `ilo-emulator --backend qemu`,
# `vmdeploy-conductor serve`, the `baremetal` CLI), under QEMU TCG, BIOS (SeaBIOS), prints the
# medians of RUNS runs of:
#   - the deploy ISO's size, and its ratio to the 12 MiB budget;
#   - QEMU start -> the conductor's first heartbeat (agent_ilo) and QEMU start ->
#     pass_deploy_info (iscsi_ilo), both ends from the logs' UTC RFC 3339 timestamps (the
#     emulator's "QEMU started", the conductor's request line less its elapsed_ms); the iSCSI
#     one as a ratio to the 15 s target and to the peer, measured in the same run: a minimal
#     init (the test OS's busybox /init with no root, from a boot ISO) booted under the same
#     QEMU machine, QEMU start -> its first line;
#   - the whole agent_ilo deploy of the raw test OS and the whole iscsi_ilo deploy of the
#     partition test OS (netboot), from `baremetal node deploy` to the marker with the right
#     root UUID on the node's console (each deploy is checked: that marker, `active`, no error);
#   - the conductor's VmRSS: idle (before each deploy) and peak (sampled every 100 ms during it).
# The load average is printed with every run. The measurement is the example program
# tests/integration/examples/e2e_bench.rs.
#
# Usage: flock /tmp/vmdeploy-heavy.lock bash bench/e2e.sh
#   (QEMU, fixed labels and ports for several minutes: run it alone, under the lock)
# Environment: RUNS (default 3), PROFILE (cargo profile of the lab's binaries, default dev: the
# guest's speed under TCG is what is measured, not the host binaries'), BUILD=0 to use binaries
# already built, CARGO_TARGET_DIR (as cargo), VMDEPLOY_VENV (the venv with `baremetal`).
# Needs what the e2e tests need: qemu-system-x86, socat, curl, the kernel .deb in .cache/kernel,
# the static musl agent (cargo build -p vmdeploy-agent --target x86_64-unknown-linux-musl) and
# the venv of scripts/setup. A failed run leaves the logs in target/e2e-artifacts/bench_*/.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
RUNS="${RUNS:-3}"
PROFILE="${PROFILE:-dev}"
TARGET_DIR="${CARGO_TARGET_DIR:-$ROOT/target}"
case "$RUNS" in '' | *[!0-9]* | 0) echo "RUNS=$RUNS: a positive number" >&2; exit 64 ;; esac

for tool in qemu-system-x86_64:qemu-system-x86 socat:socat curl:curl; do
  command -v "${tool%%:*}" >/dev/null || { echo "${tool%%:*} missing: apt-get install ${tool#*:}" >&2; exit 1; }
done

if [ "${BUILD:-1}" = 1 ]; then
  (cd "$ROOT" && cargo build --profile "$PROFILE" -p vmdeploy-conductor -p vmdeploy-ilo-emulator \
    -p vmdeploy-image-build --bins)
  (cd "$ROOT" && cargo build --profile "$PROFILE" -p vmdeploy-integration-tests --example e2e_bench)
fi
bindir="$TARGET_DIR/$([ "$PROFILE" = dev ] && echo debug || echo "$PROFILE")"
for b in vmdeploy-conductor ilo-emulator vmdeploy-image-build examples/e2e_bench; do
  [ -x "$bindir/$b" ] || { echo "$bindir/$b missing (run without BUILD=0)" >&2; exit 1; }
done

echo "e2e bench: $RUNS runs, $PROFILE build of the lab's binaries; load average: $(cut -d' ' -f1-3 /proc/loadavg)"
out="$(mktemp /var/tmp/vmdeploy-e2e-bench.XXXXXX)"
trap 'rm -f "$out"' EXIT
# The BENCH lines as they come (a run takes minutes); the whole output is kept for a failure.
if ! (cd "$ROOT" && VMDEPLOY_BIN_DIR="$bindir" VMDEPLOY_BENCH_RUNS="$RUNS" \
  RUST_LOG="${RUST_LOG:-warn}" "$bindir/examples/e2e_bench") 2>&1 | tee "$out" \
  | grep --line-buffered '^BENCH' | sed -u 's/^BENCH \{0,1\}//'; then
  echo "the measurement failed; its output:" >&2
  tail -n 60 "$out" >&2
  exit 1
fi
