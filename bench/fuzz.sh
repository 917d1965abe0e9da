#!/usr/bin/env bash
# Runs the cargo-fuzz targets in fuzz/ (one per parser of untrusted bytes, listed in
# bench/README.md) and prints, per target: runs done, executions per second, crashes (0 or the
# artifact the crash was saved to) and coverage (libFuzzer's final `cov:` and `ft:` figures).
#
#   bash bench/fuzz.sh                      every target, RUNS runs each (default 10,000,000)
#   bash bench/fuzz.sh --runs 200000 dhcp   one target, 200,000 runs
#   bash bench/fuzz.sh --seconds 5          every target for 5 s (the CI smoke run)
#   JOBS=2 bash bench/fuzz.sh               two targets at a time
#   bash bench/fuzz.sh --build-only         build every target and stop (a later run reuses it)
#
# Installs cargo-fuzz when it is missing. On a stable toolchain it sets RUSTC_BOOTSTRAP=1: the
# fuzz build passes -Z flags (coverage instrumentation), which stable rustc takes with it.
# No sanitizer: the parsers are safe Rust, so what is hunted is a panic (debug assertions and
# overflow checks stay on, `-a`), a timeout and runaway memory; AddressSanitizer would make
# every run about 5x slower for nothing it could find.
#
# The working corpus (fuzz/corpus/<target>) starts from the committed seeds (fuzz/seeds/<target>)
# and grows from run to run; libFuzzer's logs go to fuzz/logs/<target>.log, crashing inputs to
# fuzz/artifacts/<target>/. Exits non-zero when a target fails to build or crashes.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"

RUNS="${RUNS:-10000000}"
BUDGET=""
JOBS="${JOBS:-1}"
RSS_MB="${FUZZ_RSS_MB:-2048}"
# Seconds one input may take before libFuzzer calls it a hang.
TIMEOUT="${FUZZ_TIMEOUT:-10}"
BUILD_ONLY=0
TARGETS=()
while [ $# -gt 0 ]; do
    case "$1" in
    --runs) RUNS="$2"; shift 2 ;;
    --seconds) BUDGET="$2"; shift 2 ;;
    --jobs) JOBS="$2"; shift 2 ;;
    --build-only) BUILD_ONLY=1; shift ;;
    -h | --help) sed -n '2,20p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//'; exit 0 ;;
    -*) echo "unknown option $1" >&2; exit 2 ;;
    *) TARGETS+=("$1"); shift ;;
    esac
done

# Longest input per target: a few KiB for headers and bodies; more where an input is a whole
# conversation (iSCSI) or a disk image (FAT, GPT, qcow2 tables).
max_len() {
    case "$1" in
    iscsi_target | iscsi_initiator | iscsi_pdu) echo 65536 ;;
    floppy | configdrive | partition_tables | qcow2 | deploy_cd) echo 131072 ;;
    scsi | http_range | tftp | dhcp) echo 1024 ;;
    *) echo 8192 ;;
    esac
}

command -v cargo-fuzz >/dev/null || cargo install cargo-fuzz --locked
# The targets that read a disk image or a qcow2 file write each input to a scratch file first:
# on tmpfs that costs a memory copy, on a disk a write and a flush (several times slower).
if [ -z "${TMPDIR:-}" ] && [ -d /dev/shm ] && [ -w /dev/shm ]; then
    export TMPDIR=/dev/shm
fi
if ! rustc --version | grep -q nightly; then
    export RUSTC_BOOTSTRAP=1
fi
# FUZZ_OPT_LEVEL (say 1) builds the targets at a lower optimisation level: a smoke run's few
# seconds need no speed, and the build is shorter. The same level must be given to a build and
# to the runs that reuse it, or the runs build again.
if [ -n "${FUZZ_OPT_LEVEL:-}" ]; then
    export CARGO_PROFILE_RELEASE_OPT_LEVEL="$FUZZ_OPT_LEVEL"
fi
FLAGS=(-O -a --sanitizer none --target-dir "$ROOT/fuzz/target")

ALL=()
while IFS= read -r t; do ALL+=("$t"); done < <(cargo fuzz list)
if [ ${#TARGETS[@]} -eq 0 ]; then
    TARGETS=("${ALL[@]}")
fi
for t in "${TARGETS[@]}"; do
    printf '%s\n' "${ALL[@]}" | grep -qx "$t" || { echo "no fuzz target $t (cargo fuzz list)" >&2; exit 2; }
done

LOGS="$ROOT/fuzz/logs"
mkdir -p "$LOGS"
echo "building ${#TARGETS[@]} fuzz targets ..." >&2
if ! cargo fuzz build "${FLAGS[@]}" >"$LOGS/build.log" 2>&1; then
    tail -n 30 "$LOGS/build.log" >&2
    echo "the fuzz targets do not build (log: fuzz/logs/build.log)" >&2
    exit 1
fi
if [ "$BUILD_ONLY" = 1 ]; then
    echo "built ${#TARGETS[@]} fuzz targets" >&2
    exit 0
fi

run_one() {
    local t="$1" corpus="$ROOT/fuzz/corpus/$1" artifacts="$ROOT/fuzz/artifacts/$1/"
    mkdir -p "$corpus" "$artifacts"
    if [ -d "$ROOT/fuzz/seeds/$t" ]; then
        cp -n "$ROOT/fuzz/seeds/$t"/* "$corpus/" 2>/dev/null || true
    fi
    local limit=(-runs="$RUNS")
    [ -n "$BUDGET" ] && limit=(-max_total_time="$BUDGET")
    local status=0
    cargo fuzz run "${FLAGS[@]}" "$t" "$corpus" -- \
        "${limit[@]}" -max_len="$(max_len "$t")" -rss_limit_mb="$RSS_MB" -timeout="$TIMEOUT" \
        -artifact_prefix="$artifacts" -print_final_stats=1 \
        >"$LOGS/$t.log" 2>&1 || status=$?
    local log="$LOGS/$t.log"
    local runs rate cov ft crash
    runs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log" | tail -n1)
    rate=$(sed -n 's/^stat::average_exec_per_sec: *//p' "$log" | tail -n1)
    cov=$(grep -oE 'cov: [0-9]+' "$log" | tail -n1 | cut -d' ' -f2)
    ft=$(grep -oE 'ft: [0-9]+' "$log" | tail -n1 | cut -d' ' -f2)
    crash=$(sed -n 's/.*Test unit written to \(.*\)$/\1/p' "$log" | head -n1)
    if [ -z "$crash" ] && [ "$status" -ne 0 ]; then
        crash="exit $status (fuzz/logs/$t.log)"
    fi
    printf '%s\t%s\t%s\t%s\t%s\t%s\n' "$t" "${runs:-?}" "${rate:-?}" "${crash:-0}" \
        "${cov:-?}" "${ft:-?}" >"$LOGS/$t.result"
}

start=$(date +%s)
running=0
for t in "${TARGETS[@]}"; do
    rm -f "$LOGS/$t.result"
    run_one "$t" &
    running=$((running + 1))
    if [ "$running" -ge "$JOBS" ]; then
        wait -n || true
        running=$((running - 1))
    fi
done
wait

{
    printf 'target\truns\texec/s\tcrashes\tcov\tft\n'
    for t in "${TARGETS[@]}"; do
        if [ -f "$LOGS/$t.result" ]; then
            cat "$LOGS/$t.result"
        else
            printf '%s\t?\t?\tno result (fuzz/logs/%s.log)\t?\t?\n' "$t" "$t"
        fi
    done
} | column -t -s $'\t'
echo "wall time: $(($(date +%s) - start)) s; logs in fuzz/logs/" >&2
for t in "${TARGETS[@]}"; do
    [ -f "$LOGS/$t.result" ] && [ "$(cut -f4 "$LOGS/$t.result")" = 0 ] || exit 1
done
exit 0
