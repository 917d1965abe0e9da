#!/usr/bin/env bash
# End-to-end benchmark, run by hand, not in CI.
#
# Through the end-to-end lab (tests/integration/src/e2e.rs: `ilo-emulator --backend qemu`,
# `vmdeploy-conductor serve`, the `baremetal` CLI), under QEMU TCG, BIOS (SeaBIOS), prints the
# medians of RUNS runs of:
#   - the deploy ISO's size, and its ratio to the 64 MiB budget;
#   - the bytes the agent_ilo deploy boot read from the virtual CD (the emulator's count), as a
#     ratio to issue 29's 16 MiB target and to the ISO's size;
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

# shellcheck source=bench/lab.sh
. "$ROOT/bench/lab.sh"
need_tools qemu-system-x86_64:qemu-system-x86 socat:socat curl:curl

LAB_BINS=(vmdeploy-conductor ilo-emulator vmdeploy-image-build)
lab_build e2e_bench vmdeploy-conductor vmdeploy-ilo-emulator vmdeploy-image-build

echo "e2e bench: $RUNS runs, $PROFILE build of the lab's binaries; load average: $(cut -d' ' -f1-3 /proc/loadavg)"
run_lab_example e2e_bench VMDEPLOY_BENCH_RUNS="$RUNS"
