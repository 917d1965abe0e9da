#!/usr/bin/env bash
# Upstream-Ironic interop benchmark (issue 15), run by hand, not in CI.
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

for tool in qemu-system-x86_64:qemu-system-x86 xorrisofs:xorriso curl:curl; do
  command -v "${tool%%:*}" >/dev/null || { echo "${tool%%:*} missing: apt-get install ${tool#*:}" >&2; exit 1; }
done
[ -x "$VENV/bin/ironic" ] || { echo "$VENV/bin/ironic missing: run scripts/setup" >&2; exit 1; }

if [ "${BUILD:-1}" = 1 ]; then
  (cd "$ROOT" && cargo build --profile "$PROFILE" -p vmdeploy-ilo-emulator -p vmdeploy-image-build --bins)
  (cd "$ROOT" && cargo build --profile "$PROFILE" -p vmdeploy-integration-tests --example ironic_bench)
fi
bindir="$TARGET_DIR/$([ "$PROFILE" = dev ] && echo debug || echo "$PROFILE")"
for b in ilo-emulator vmdeploy-image-build examples/ironic_bench; do
  [ -x "$bindir/$b" ] || { echo "$bindir/$b missing (run without BUILD=0)" >&2; exit 1; }
done

echo "Ironic interop bench: $("$VENV/bin/python" -c 'import importlib.metadata as m; print("ironic", m.version("ironic"))'); load average: $(cut -d' ' -f1-3 /proc/loadavg)"
out="$(mktemp /var/tmp/vmdeploy-ironic-bench.XXXXXX)"
trap 'rm -f "$out"' EXIT
if ! (cd "$ROOT" && VMDEPLOY_BIN_DIR="$bindir" VMDEPLOY_VENV="$VENV" \
  RUST_LOG="${RUST_LOG:-warn}" "$bindir/examples/ironic_bench") 2>&1 | tee "$out" \
  | grep --line-buffered '^BENCH' | sed -u 's/^BENCH \{0,1\}//'; then
  echo "the measurement failed; its output:" >&2
  tail -n 60 "$out" >&2
  exit 1
fi
