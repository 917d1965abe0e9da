//! The measurement behind `bench/e2e.sh`, an example program rather
//! than a test so that the test run neither runs nor lists it: whole deploys of the project's
//! test OS through the end-to-end lab (`ilo-emulator --backend qemu`, `vmdeploy-conductor
//! serve`, the `baremetal` CLI), under TCG, BIOS (SeaBIOS).
//!
//! Per run, in this order:
//! - the peer docs/architecture.md §10 names: a minimal init booted from an ISO under the same QEMU machine
//!   as the lab's node (q35 with SeaBIOS, one CPU, 512 MiB, no display, the CD a USB CD on xHCI
//!   as the node's virtual media). The init
//!   is the test OS's own busybox `/init`: with no `root=UUID=` it loads its modules and prints
//!   `VMDEPLOY-TEST-OS failed: no root=UUID=...` as its first line; the ISO is
//!   `vmdeploy-image-build boot-iso` of the test OS's kernel and ramdisk (the loader a netboot
//!   uses). The time runs from QEMU's start to that line (read unbuffered from QEMU's stdout).
//! - `agent_ilo`, the raw whole-disk test OS: from `baremetal node deploy` to the marker with
//!   the disk image's root UUID on the console, and from the emulator's "QEMU started" (the
//!   deploy ISO's boot) to the conductor's first heartbeat request.
//! - `iscsi_ilo`, the partition test OS, netboot: from `baremetal node deploy` to the marker
//!   with the partition image's root UUID, and from "QEMU started" to `pass_deploy_info`.
//!
//! Both log ends are the logs' own UTC RFC 3339 timestamps (microseconds); the conductor logs a
//! request when it answers it, with `elapsed_ms`, so the arrival is that line's time minus the
//! elapsed time. The console is polled every 200 ms for the marker. The conductor's VmRSS is
//! sampled every 100 ms from `/proc/<pid>/status` during each deploy (peak) and once before it
//! (idle, after enrolment).
//!
//! Output: `BENCH `-prefixed lines (the script shows those), medians over the runs.
//! Environment (set by the script): `VMDEPLOY_BENCH_RUNS` (default 3), `VMDEPLOY_BIN_DIR` (the
//! binaries the lab starts).

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use time::format_description::well_known::Rfc3339;
use time::OffsetDateTime;
use vmdeploy_integration_tests::e2e::{partition_media, Firmware, Lab, LabOptions};
use vmdeploy_integration_tests::qemu::Qemu;
use vmdeploy_integration_tests::rss::{rss_kib, RssSampler};
use vmdeploy_integration_tests::test_image::{self, TestImage};
use vmdeploy_integration_tests::{bin, deploy_iso};

/// The deploy ISO's budget (docs/architecture.md §10).
const ISO_BUDGET: u64 = 64 * 1024 * 1024;
/// Issue 29's target for the bytes a deploy boot reads from the virtual CD.
const CD_READ_TARGET: f64 = 16.0 * 1024.0 * 1024.0;
/// QEMU start → `pass_deploy_info`, TCG, BIOS: the target (docs/architecture.md §10).
const CALLBACK_TARGET_SECS: f64 = 15.0;
/// A whole deploy under TCG on a busy 2-core machine (the e2e tests' limits, summed).
const DEPLOY_LIMIT: Duration = Duration::from_secs(600);
const PEER_LIMIT: Duration = Duration::from_secs(180);

fn loadavg() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .map(|s| s.split_whitespace().take(3).collect::<Vec<_>>().join(" "))
        .unwrap_or_else(|e| format!("? ({e})"))
}

fn median(values: &[f64]) -> f64 {
    let mut v = values.to_vec();
    v.sort_by(f64::total_cmp);
    let n = v.len();
    if n % 2 == 1 {
        v[n / 2]
    } else {
        (v[n / 2 - 1] + v[n / 2]) / 2.0
    }
}

fn list(values: &[f64], unit: &str) -> String {
    values
        .iter()
        .map(|v| format!("{v:.1}{unit}"))
        .collect::<Vec<_>>()
        .join(", ")
}

fn read(path: &Path) -> Vec<u8> {
    std::fs::read(path).unwrap_or_else(|e| panic!("reading {}: {e}", path.display()))
}

/// The leading RFC 3339 timestamp of a log line.
fn line_time(line: &str) -> Option<OffsetDateTime> {
    let stamp = line.split_whitespace().next()?;
    OffsetDateTime::parse(stamp, &Rfc3339).ok()
}

/// The first "QEMU started" of the emulator's log at or after `since`.
fn qemu_started(emulator_log: &str, since: OffsetDateTime) -> OffsetDateTime {
    emulator_log
        .lines()
        .filter(|l| l.contains("QEMU started"))
        .filter_map(line_time)
        .find(|t| *t >= since)
        .unwrap_or_else(|| panic!("no \"QEMU started\" in the emulator's log after {since}"))
}

/// When the first successful request whose path contains `path_part` arrived at the conductor
/// (the line's time minus its `elapsed_ms`).
fn request_arrival(conductor_log: &str, path_part: &str) -> OffsetDateTime {
    conductor_log
        .lines()
        .filter(|l| l.contains(path_part) && l.contains("answered status=2"))
        .find_map(|l| {
            let answered = line_time(l)?;
            let elapsed_ms: f64 = l
                .split("elapsed_ms=")
                .nth(1)?
                .trim_matches(|c: char| c == '"' || c.is_whitespace())
                .split('"')
                .next()?
                .parse()
                .ok()?;
            Some(answered - Duration::from_secs_f64(elapsed_ms / 1000.0))
        })
        .unwrap_or_else(|| panic!("no answered request to {path_part} in the conductor's log"))
}

fn seconds_between(from: OffsetDateTime, to: OffsetDateTime) -> f64 {
    (to - from).as_seconds_f64()
}

/// One deploy's figures.
struct Deploy {
    /// `baremetal node deploy` → the marker on the console, s.
    whole: f64,
    /// QEMU start → the ramdisk's first call (heartbeat or pass_deploy_info), s.
    callback: f64,
    idle_rss_kib: u64,
    peak_rss_kib: u64,
    /// Bytes the deploy boot read from the virtual CD (the emulator's count, per boot).
    cd_read_bytes: u64,
}

/// Waits for `marker` on the console (every 200 ms), failing at a failed provision state or at
/// the limit; returns when it showed.
fn wait_marker(lab: &Lab, node: &str, marker: &str, failure: &str) -> Instant {
    let deadline = Instant::now() + DEPLOY_LIMIT;
    let mut polls = 0u32;
    loop {
        let console = lab.console();
        if console.contains(marker) {
            return Instant::now();
        }
        if let Some(line) = console.lines().find(|l| l.contains(failure)) {
            panic!("the test OS failed: {line}");
        }
        polls += 1;
        if polls.is_multiple_of(25) {
            let shown = lab.show(node);
            let state = shown["provision_state"].as_str().unwrap_or_default();
            assert!(
                !(state.ends_with("failed") || state == "error"),
                "node {node} is {state}: {}",
                shown["last_error"]
            );
        }
        assert!(
            Instant::now() < deadline,
            "{marker:?} not on the console after {DEPLOY_LIMIT:?}"
        );
        std::thread::sleep(Duration::from_millis(200));
    }
}

fn pid_of(lab: &Lab) -> u32 {
    lab.conductor_pid()
        .expect("the lab runs vmdeploy-conductor serve")
}

fn agent_deploy(image: &TestImage, run: usize) -> Deploy {
    let media_path = "/test-os.raw";
    let lab = Lab::start(
        &format!("bench_agent_ilo_{run}"),
        LabOptions {
            media: vec![(media_path.into(), read(&image.disk_raw))],
            ..Default::default()
        },
    );
    let node = lab.enroll("bench-agent", "agent_ilo", Firmware::Bios);
    lab.set_whole_disk_image(
        &node,
        &lab.guest_media_url(media_path),
        "raw",
        &image.disk_sha256,
        &[],
    );
    let marker = image.marker(&image.disk_root_uuid);
    measure(&lab, &node, &marker, image, "/v1/heartbeat/")
}

fn iscsi_deploy(image: &TestImage, run: usize) -> Deploy {
    let lab = Lab::start(
        &format!("bench_iscsi_ilo_{run}"),
        LabOptions {
            media: partition_media(image),
            ..Default::default()
        },
    );
    let node = lab.enroll("bench-iscsi", "iscsi_ilo", Firmware::Bios);
    lab.set_partition_image(&node, image);
    let marker = image.marker(&image.part_root_uuid);
    let deploy = measure(
        &lab,
        &node,
        &marker,
        image,
        "/vendor_passthru/pass_deploy_info",
    );
    let shown = lab.show(&node);
    assert_eq!(
        shown["driver_internal_info"]["iscsi_boot_option"], "netboot",
        "{shown}"
    );
    deploy
}

/// Deploys `node` and times it; checks the marker (the root UUID) and `active`.
fn measure(lab: &Lab, node: &str, marker: &str, image: &TestImage, callback: &str) -> Deploy {
    assert_eq!(lab.console_count(marker), 0, "the marker before the deploy");
    let pid = pid_of(lab);
    let idle_rss_kib = rss_kib(pid).expect("the conductor's VmRSS");
    let sampler = RssSampler::start(pid);
    let called = OffsetDateTime::now_utc();
    let started = Instant::now();
    lab.bm(&["node", "deploy", node]);
    let failure = image.marker_prefix.replace("booted root=", "failed:");
    let seen = wait_marker(lab, node, marker, &failure);
    let whole = seen.duration_since(started).as_secs_f64();
    let peak_rss_kib = sampler.peak();
    let shown = lab.show(node);
    assert_eq!(shown["provision_state"], "active", "{shown}");
    assert_eq!(shown["last_error"], serde_json::Value::Null, "{shown}");
    let qemu = qemu_started(&lab.emulator_log(), called);
    let arrived = request_arrival(&lab.conductor_log(), callback);
    let machine = lab.emulator_state()["machine"].clone();
    let cd_read_bytes = machine["media"]["CDROM"]["read_bytes"]
        .as_u64()
        .unwrap_or_else(|| panic!("the emulator counts no CD reads: {machine}"));
    Deploy {
        whole,
        callback: seconds_between(qemu, arrived),
        idle_rss_kib,
        peak_rss_kib,
        cd_read_bytes,
    }
}

/// The peer's ISO: the test OS's kernel and ramdisk with no root (its init's first line).
fn peer_iso(image: &TestImage, dir: &Path) -> PathBuf {
    let iso = dir.join("minimal-init.iso");
    let out = std::process::Command::new(bin("vmdeploy-image-build"))
        .arg("boot-iso")
        .arg("--kernel")
        .arg(&image.kernel)
        .arg("--ramdisk")
        .arg(&image.ramdisk)
        .args(["--cmdline", "vmdeploy_test_os.poweroff=1 panic=-1"])
        .arg("-o")
        .arg(&iso)
        .output()
        .expect("running vmdeploy-image-build boot-iso");
    assert!(
        out.status.success(),
        "boot-iso failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    iso
}

/// QEMU start → the minimal init's first line, s.
fn peer_boot(iso: &Path, dir: &Path) -> f64 {
    let drive = format!(
        "if=none,id=vcd,media=cdrom,format=raw,readonly=on,file={}",
        iso.display()
    );
    let args: Vec<String> = [
        // The node's machine (tests/ilo-emulator/src/qemu/machine.rs): q35 with SeaBIOS for
        // both firmwares, one CPU, no display; Qemu::start adds -m 512 and the serial on stdio.
        "-machine",
        "q35",
        "-smp",
        "1",
        "-vga",
        "none",
        "-nic",
        "none",
        "-device",
        "qemu-xhci,id=xhci",
        "-drive",
        &drive,
        "-device",
        "usb-bot,bus=xhci.0,id=vcdbot",
        "-device",
        "scsi-cd,bus=vcdbot.0,drive=vcd,bootindex=0",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    let mut vm = Qemu::start(&args, &dir.join("minimal-init-serial.log"));
    let line = vm.wait_for(PEER_LIMIT, |l| {
        l.contains("VMDEPLOY-TEST-OS failed: no root")
    });
    vm.kill();
    match line {
        Some(l) => l.at.as_secs_f64(),
        None => {
            vm.dump();
            panic!("the minimal init's line did not show within {PEER_LIMIT:?}");
        }
    }
}

fn main() {
    let runs: usize = std::env::var("VMDEPLOY_BENCH_RUNS")
        .ok()
        .map(|v| {
            v.parse()
                .unwrap_or_else(|_| panic!("VMDEPLOY_BENCH_RUNS={v}: not a number"))
        })
        .unwrap_or(3);
    assert!(runs > 0, "VMDEPLOY_BENCH_RUNS must be at least 1");
    let iso = deploy_iso::deploy_iso();
    let iso_size = std::fs::metadata(&iso)
        .unwrap_or_else(|e| panic!("{}: {e}", iso.display()))
        .len();
    let image = test_image::ensure();
    let scratch = tempfile::Builder::new()
        .prefix("e2e-bench")
        .tempdir_in("/var/tmp")
        .expect("scratch directory");
    let peer = peer_iso(&image, scratch.path());

    println!(
        "BENCH e2e bench: {runs} runs, TCG, BIOS (SeaBIOS), 512 MiB node; load average before: {}",
        loadavg()
    );
    let (mut peers, mut agents, mut iscsis) = (Vec::new(), Vec::new(), Vec::new());
    for run in 1..=runs {
        let p = peer_boot(&peer, scratch.path());
        println!(
            "BENCH   run {run}: minimal init's first line {p:.1} s (load {})",
            loadavg()
        );
        let a = agent_deploy(&image, run);
        println!(
            "BENCH   run {run}: agent_ilo  QEMU→heartbeat {:.1} s, deploy→marker {:.1} s, RSS idle {} / peak {} KiB (load {})",
            a.callback, a.whole, a.idle_rss_kib, a.peak_rss_kib, loadavg()
        );
        let i = iscsi_deploy(&image, run);
        println!(
            "BENCH   run {run}: iscsi_ilo  QEMU→pass_deploy_info {:.1} s, deploy→marker {:.1} s, RSS idle {} / peak {} KiB (load {})",
            i.callback, i.whole, i.idle_rss_kib, i.peak_rss_kib, loadavg()
        );
        peers.push(p);
        agents.push(a);
        iscsis.push(i);
    }

    let col = |v: &[Deploy], f: fn(&Deploy) -> f64| v.iter().map(f).collect::<Vec<f64>>();
    let peer_med = median(&peers);
    let callback = col(&iscsis, |d| d.callback);
    let callback_med = median(&callback);
    // Idle: before every deploy of both drivers; peaks per driver (their work differs: the
    // iSCSI initiator writes the image, the agent streams it itself).
    let idle: Vec<f64> = agents
        .iter()
        .chain(iscsis.iter())
        .map(|d| d.idle_rss_kib as f64 / 1024.0)
        .collect();
    let rows: Vec<(&str, Vec<f64>, &str)> = vec![
        (
            "minimal init, QEMU start → first line (peer)",
            peers.clone(),
            "s",
        ),
        (
            "agent_ilo: QEMU start → first heartbeat",
            col(&agents, |d| d.callback),
            "s",
        ),
        (
            "iscsi_ilo: QEMU start → pass_deploy_info",
            callback.clone(),
            "s",
        ),
        (
            "agent_ilo raw: node deploy → marker",
            col(&agents, |d| d.whole),
            "s",
        ),
        (
            "iscsi_ilo partition: node deploy → marker",
            col(&iscsis, |d| d.whole),
            "s",
        ),
        (
            "agent_ilo: bytes read from the virtual CD",
            col(&agents, |d| d.cd_read_bytes as f64 / 1048576.0),
            "MiB",
        ),
        ("conductor VmRSS idle (before each deploy)", idle, "MiB"),
        (
            "conductor VmRSS peak, agent_ilo deploys",
            col(&agents, |d| d.peak_rss_kib as f64 / 1024.0),
            "MiB",
        ),
        (
            "conductor VmRSS peak, iscsi_ilo deploys",
            col(&iscsis, |d| d.peak_rss_kib as f64 / 1024.0),
            "MiB",
        ),
    ];

    println!("BENCH");
    println!("BENCH {:<46} {:>10}  runs; ratios", "measure", "median");
    println!(
        "BENCH {:<46} {:>10}  {:.2} x the 64 MiB budget",
        "deploy ISO size",
        format!("{:.2} MiB", iso_size as f64 / 1048576.0),
        iso_size as f64 / ISO_BUDGET as f64
    );
    let callback_ratios = format!(
        "; {:.2} x the 15 s target, {:.2} x the peer",
        callback_med / CALLBACK_TARGET_SECS,
        callback_med / peer_med
    );
    for (what, values, unit) in &rows {
        let cd_ratios = format!(
            "; {:.2} x the 16 MiB target, {:.2} x the ISO",
            median(values) * 1048576.0 / CD_READ_TARGET,
            median(values) * 1048576.0 / iso_size as f64
        );
        let note = if what.starts_with("iscsi_ilo: QEMU start") {
            callback_ratios.as_str()
        } else if what.contains("virtual CD") {
            cd_ratios.as_str()
        } else {
            ""
        };
        println!(
            "BENCH {what:<46} {:>10}  {}{note}",
            format!("{:.1} {unit}", median(values)),
            list(values, &format!(" {unit}"))
        );
    }
    println!("BENCH load average after: {}", loadavg());
}
