#!/usr/bin/env bash
# Slowloris probe of an HTTP listener (issue 26), run by hand, not in CI.
#
# Measures the latency of a normal request (`GET /v1` on the conductor) from 127.0.0.1, first
# alone, then while FLOOD idle TCP connections (default 10,000) are held open from other
# loopback addresses, and prints p50 and p99 of both and their ratio (flooded / normal), with
# how many of the flood's connections the listener kept (the rest it closed at once:
# `api.max_connections_per_client`, `api.max_connections`).
#
# The flood comes from FLOOD_SOURCES addresses, 127.0.0.2 onwards (default 1: one attacker; a
# flood from as many addresses as it takes to pass `api.max_connections` fills the listener for
# everyone until the header timeout frees the places, which the printout then shows). Each flood
# connection sends half a request line and stalls (the worst kind: hyper's header clock runs,
# 30 s on the conductor); the flood re-opens what the listener closes, for HOLD seconds.
#
# By default it starts `vmdeploy-conductor serve` itself on a free loopback port, as
# bench/conductor.sh does. TARGET=host:port probes a listener already running instead (e.g. an
# agent's command API on 9999, started by scripts/play-node or the e2e lab) with PROBE_PATH
# (default `/v1`; the agent answers `/` without a token).
#
# Environment: FLOOD (10000), FLOOD_SOURCES (1), HOLD (20 s of flood while measuring),
# REQUESTS (400 per phase), BUILD=0 to use a binary already built, PROFILE (cargo profile,
# default release), CARGO_TARGET_DIR, VMDEPLOY_VENV (a venv whose python3 is used; else the
# system's), TARGET, PROBE_PATH. Needs a hard open-files limit above FLOOD + 100 (the Python
# part raises its soft limit to it).
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
PROFILE="${PROFILE:-release}"
TARGET_DIR="${CARGO_TARGET_DIR:-$ROOT/target}"
PYTHON=python3
if [ -n "${VMDEPLOY_VENV:-}" ] && [ -x "$VMDEPLOY_VENV/bin/python3" ]; then
  PYTHON="$VMDEPLOY_VENV/bin/python3"
fi
command -v "$PYTHON" >/dev/null || { echo "missing python3 (apt-get install python3)" >&2; exit 1; }

CONDUCTOR=""
if [ -z "${TARGET:-}" ]; then
  if [ "${BUILD:-1}" = 1 ]; then
    (cd "$ROOT" && cargo build --profile "$PROFILE" -p vmdeploy-conductor --bins)
  fi
  bindir="$TARGET_DIR/$([ "$PROFILE" = dev ] && echo debug || echo "$PROFILE")"
  CONDUCTOR="$bindir/vmdeploy-conductor"
  [ -x "$CONDUCTOR" ] || { echo "binary missing: $CONDUCTOR (run without BUILD=0)" >&2; exit 1; }
fi

WORK="$(mktemp -d /tmp/vmdeploy-slowloris.XXXXXX)"
trap 'rm -rf "$WORK"' EXIT

"$PYTHON" - "$CONDUCTOR" "$WORK" "${TARGET:-}" "${PROBE_PATH:-/v1}" "${FLOOD:-10000}" \
  "${FLOOD_SOURCES:-1}" "${HOLD:-20}" "${REQUESTS:-400}" <<'PY'
import os, resource, selectors, socket, statistics, subprocess, sys, threading, time

conductor, work, target, path = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4]
flood, sources, hold, requests = (int(a) for a in sys.argv[5:9])

soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
need = flood + 200
if hard != resource.RLIM_INFINITY and hard < need:
    sys.exit(f"the hard open-files limit is {hard}; FLOOD={flood} needs {need} (ulimit -Hn)")
resource.setrlimit(resource.RLIMIT_NOFILE, (need if hard == resource.RLIM_INFINITY else hard, hard))

def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port

proc = None
if target:
    host, port = target.rsplit(":", 1)
    port = int(port)
else:
    host, port = "127.0.0.1", free_port()
    config = os.path.join(work, "conductor.toml")
    with open(config, "w") as f:
        f.write(f'[api]\nlisten = ["127.0.0.1:{port}"]\n[log]\nlevel = "warn"\n')
    env = dict(os.environ, STATE_DIRECTORY=os.path.join(work, "state"))
    env.pop("RUST_LOG", None)
    log = open(os.path.join(work, "conductor.log"), "w")
    proc = subprocess.Popen([conductor, "serve", "--config", config], env=env,
                            stdout=subprocess.DEVNULL, stderr=log)

request = f"GET {path} HTTP/1.1\r\nHost: {host}:{port}\r\nConnection: close\r\n\r\n".encode()

def one_request(timeout=10.0):
    """Seconds for connect + request + the status line, or None on failure."""
    t0 = time.perf_counter()
    try:
        with socket.create_connection((host, port), timeout=timeout,
                                      source_address=("127.0.0.1", 0)) as s:
            s.sendall(request)
            head = s.recv(64)
            if not head.startswith(b"HTTP/1."):
                return None
    except OSError:
        return None
    return time.perf_counter() - t0

def measure(n):
    times, failed = [], 0
    for _ in range(n):
        t = one_request()
        if t is None:
            failed += 1
        else:
            times.append(t)
        time.sleep(0.005)
    return times, failed

def pct(xs, q):
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * len(xs)))] if xs else float("nan")

try:
    t0 = time.perf_counter()
    while one_request(2) is None:
        if time.perf_counter() - t0 > 30 or (proc and proc.poll() is not None):
            sys.exit("the listener did not answer: " +
                     (open(os.path.join(work, "conductor.log")).read() if proc else target))
        time.sleep(0.05)
    measure(20)                                   # warm-up
    normal, normal_failed = measure(requests)

    # The flood: non-blocking connects from 127.0.0.2.. , half a request line each, then
    # silence; a closed one is opened again, so the listener always sees FLOOD attempts.
    stop = threading.Event()
    stats = {"opened": 0, "closed_by_server": 0, "held": 0, "errors": 0}
    def flooder():
        sel = selectors.DefaultSelector()
        live = {}
        def open_one(i):
            s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            s.setblocking(False)
            try:
                s.bind((f"127.0.0.{2 + i % sources}", 0))
                s.connect_ex((host, port))
            except OSError:
                stats["errors"] += 1
                s.close()
                return
            sel.register(s, selectors.EVENT_READ | selectors.EVENT_WRITE, i)
            live[s] = False
            stats["opened"] += 1
        for i in range(flood):
            open_one(i)
        while not stop.is_set():
            for key, events in sel.select(timeout=0.2):
                s, i = key.fileobj, key.data
                if events & selectors.EVENT_WRITE and not live.get(s):
                    try:
                        s.send(f"GET {path} HTTP/1.1\r\nHost: ".encode())
                        live[s] = True
                        sel.modify(s, selectors.EVENT_READ, i)
                    except OSError:
                        pass
                    continue
                try:
                    data = s.recv(4096)
                except BlockingIOError:
                    continue
                except OSError:
                    data = b""
                if not data:
                    stats["closed_by_server"] += 1
                    sel.unregister(s)
                    live.pop(s, None)
                    s.close()
                    open_one(i)
            stats["held"] = sum(1 for v in live.values() if v)
        for s in list(live):
            s.close()
    th = threading.Thread(target=flooder, daemon=True)
    th.start()
    time.sleep(min(5, hold / 2))                  # let the flood build up
    flooded, flooded_failed = [], 0
    t_end = time.perf_counter() + max(1, hold - 5)
    held_samples = []
    while time.perf_counter() < t_end:
        times, failed = measure(max(1, requests // 10))
        flooded += times
        flooded_failed += failed
        held_samples.append(stats["held"])
    stop.set()
    th.join(timeout=10)
finally:
    if proc:
        proc.terminate()
        try:
            proc.wait(timeout=40)
        except subprocess.TimeoutExpired:
            proc.kill()

load = " ".join(open("/proc/loadavg").read().split()[:3])
who = target or f"vmdeploy-conductor serve on 127.0.0.1:{port} (defaults)"
print(f"slowloris probe of {who}, GET {path}, load average {load}")
print(f"flood: {flood} idle connections from {sources} address(es) 127.0.0.2.., held "
      f"{hold} s; opened {stats['opened']}, closed by the listener {stats['closed_by_server']}, "
      f"open on the flood's side at once (median; includes ones the listener closed that the flood "
      f"has not read yet) {int(statistics.median(held_samples)) if held_samples else 0}")
print()
print(f"{'':<10} {'requests':>9} {'failed':>7} {'p50 ms':>9} {'p99 ms':>9}")
for name, xs, failed in (("normal", normal, normal_failed), ("flooded", flooded, flooded_failed)):
    print(f"{name:<10} {len(xs):>9} {failed:>7} {pct(xs, .5) * 1000:>9.2f} {pct(xs, .99) * 1000:>9.2f}")
print(f"{'ratio':<10} {'':>9} {'':>7} {pct(flooded, .5) / pct(normal, .5):>9.2f} "
      f"{pct(flooded, .99) / pct(normal, .99):>9.2f}   (flooded / normal)")
PY
