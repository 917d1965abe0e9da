#!/usr/bin/env bash
# Upstream-Ironic interop benchmark, run by hand, not in CI.
#
# OpenStack Ironic 39, standalone from the setup's venv, deploys the raw test OS onto a QEMU
# node behind the emulated iLO 5 (Redfish) with our Debian kernel and initramfs as its deploy
# ramdisk (the lab of tests/integration/src/e2e/ironic.rs), under QEMU TCG, BIOS, and prints:
#   - the size of the virtual-media ISO Ironic built around our ramdisk;
#   - the time from `baremetal node deploy` to `active`, and to the test OS's marker on the
#     node's console;
#   - Ironic's VmRSS (its one process, API and conductor): idle, and peak during the deploy.
# The load average is printed before and after. The measurement is the example program
# tests/integration/examples/ironic_bench.rs.
#
# Usage: flock /tmp/vmdeploy-heavy.lock bash bench/ironic-interop.sh
#   (QEMU for several minutes: run it alone, under the lock)
# Environment: PROFILE (cargo profile of the lab's binaries, default dev), BUILD=0 to use
# binaries already built, CARGO_TARGET_DIR (as cargo), VMDEPLOY_VENV (the venv with Ironic and
# `baremetal`). Needs what the e2e tests need (scripts/setup), the static musl agent
# (cargo build --release -p vmdeploy-agent --target x86_64-unknown-linux-musl) among them. A
# failed run leaves the logs in target/e2e-artifacts/bench_ironic/.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
PROFILE="${PROFILE:-dev}"
TARGET_DIR="${CARGO_TARGET_DIR:-$ROOT/target}"
VENV="${VMDEPLOY_VENV:-$ROOT/.venv}"

# shellcheck source=bench/lab.sh
. "$ROOT/bench/lab.sh"
need_tools qemu-system-x86_64:qemu-system-x86 xorrisofs:xorriso curl:curl
[ -x "$VENV/bin/ironic" ] || { echo "$VENV/bin/ironic missing: run scripts/setup" >&2; exit 1; }

LAB_BINS=(ilo-emulator vmdeploy-image-build)
lab_build ironic_bench vmdeploy-ilo-emulator vmdeploy-image-build

echo "Ironic interop bench: $("$VENV/bin/python" -c 'import importlib.metadata as m; print("ironic", m.version("ironic"))'); load average: $(cut -d' ' -f1-3 /proc/loadavg)"
run_lab_example ironic_bench VMDEPLOY_VENV="$VENV"
