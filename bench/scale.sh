#!/usr/bin/env bash
# Scale benchmark (issue 27), run by hand, not in CI.
#
# In one run, side by side (docs/architecture.md §10, "conductor: concurrent deploys" and
# "node list at 10,000 nodes"):
#   1. vmdeploy: the in-memory iLO emulator with N servers, the fake-ramdisk harness as the
#      agent of all of them (auto-TLS), and N concurrent agent_ilo deploys through the API
#      (enroll with ports, manage, provide without cleaning, then PUT active for all N at once
#      and poll until each is active or failed), in the set-ups of SETUPS:
#        sqlite  one conductor on SQLite
#        pg      one conductor on PostgreSQL (a private cluster, tests/postgres)
#        pg3     three conductors on one PostgreSQL database behind a TCP round-robin front
#                door (API calls and the ramdisks' deploy.api_url go to it)
#      Release builds. Per set-up: deploys/min, first provision request -> last active, API
#      p50/p99 under load (GET /v1/nodes/{uuid} and GET /v1/nodes?limit=50 from a sampler,
#      SAMPLER_HZ a second), each conductor's peak RSS (VmHWM) and CPU seconds (/proc), the
#      database's CPU seconds and peak connections (pg_stat_activity), errors, CPU s per deploy
#      (conductors + database) and the ratio of pg3 to sqlite and pg; PASS/FAIL against the
#      targets (one conductor: RSS <= 200 MiB, API p99 <= 50 ms, no error; three: CPU s per
#      deploy within 1.2x of one, no error).
#   2. LISTING=1: LIST_NODES nodes enrolled through the API of one conductor (SQLite), then 50
#      GET /v1/nodes?detail=True (a page of api.max_limit = 1000): p50/p99 against 100 ms.
#   3. IRONIC=1: upstream Ironic 39 standalone from the venv, after vmdeploy's runs: one
#      all-in-one `ironic` process, SQLite, noauth, fake-hardware nodes with the fake
#      boot/deploy/power/management interfaces (Ironic's fake agent is its `fake` deploy
#      interface), the same flow and figures; N first, then the next smaller of 1000, 500,
#      200, 100 until one completes within IRONIC_BUDGET_SECS (900) of its first enrollment.
#   The load average before and after, and one table with every set-up and Ironic.
# The measurement is the example program tests/integration/examples/scale_bench.rs (its header
# says what each figure is and how it is read).
#
# Usage: nice -n 19 bash bench/scale.sh   (under flock /tmp/vmdeploy-heavy.lock for N=1000:
#   every core for many minutes)
# Environment: N (1000), SETUPS (sqlite,pg,pg3), IRONIC (1), LISTING (0), LIST_NODES (10000),
# PHASE_SECS (900), IRONIC_BUDGET_SECS (900), HEARTBEAT_SCALE (1.0, the agent's timing),
# BOOT_DELAY_MS (2000), WRITE_DELAY_MS (2000), AGENT_TLS (auto|off), SAMPLER_HZ (5),
# KEEP_DIR=1 (keep the logs; the run prints where), PROFILE (cargo profile, default release),
# BUILD=0 (use binaries already built), CARGO_TARGET_DIR, VMDEPLOY_VENV (the venv with Ironic),
# EMULATOR_ARGS (more ilo-emulator arguments: the slow media read of a real BMC is
# "--boot-read-mib 32 --range-kib 64 --range-latency-ms 10" with ISO_KIB=32768, each boot then
# reading 512 ranges from the conductor's object store; a firmware profile is
# "--profile ilo5-2.7x"), ISO_KIB (64: the deploy ISO stand-in's size, which bounds the read).
# Needs PostgreSQL for pg/pg3 and the venv's Ironic for IRONIC=1 (scripts/setup installs both).
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
PROFILE="${PROFILE:-release}"
TARGET_DIR="${CARGO_TARGET_DIR:-$ROOT/target}"
VENV="${VMDEPLOY_VENV:-$ROOT/.venv}"
SETUPS="${SETUPS-sqlite,pg,pg3}"
IRONIC="${IRONIC:-1}"

# shellcheck source=bench/lab.sh
. "$ROOT/bench/lab.sh"
if [ "$IRONIC" = 1 ] && [ ! -x "$VENV/bin/ironic" ]; then
  echo "$VENV/bin/ironic missing: run scripts/setup (or IRONIC=0)" >&2
  exit 1
fi
case ",$SETUPS," in
  *,pg,* | *,pg3,*)
    compgen -G '/usr/lib/postgresql/*/bin/initdb' >/dev/null || [ -n "${VMDEPLOY_PG_BINDIR:-}" ] \
      || { echo "PostgreSQL missing: apt-get install postgresql (or SETUPS=sqlite)" >&2; exit 1; }
    ;;
esac

LAB_BINS=(ilo-emulator vmdeploy-conductor)
lab_build scale_bench vmdeploy-conductor vmdeploy-ilo-emulator

echo "Scale bench ($PROFILE build), $(nproc) cores; load average: $(cut -d' ' -f1-3 /proc/loadavg)"
run_lab_example scale_bench VMDEPLOY_VENV="$VENV" SETUPS="$SETUPS" IRONIC="$IRONIC"
