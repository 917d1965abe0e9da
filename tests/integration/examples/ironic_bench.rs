//! The upstream-Ironic interop benchmark, run by `bench/ironic-interop.sh`.
//!
//! In the Ironic lab (tests/integration/src/e2e/ironic.rs: Ironic 39 standalone, the emulated
//! iLO 5 with its QEMU node, our kernel and initramfs as Ironic's deploy ramdisk), one
//! whole-disk deploy of the raw test OS in BIOS, and:
//! - the size of the virtual-media ISO Ironic built around our ramdisk (the largest file under
//!   its HTTP root's `redfish/` while the deploy runs: Ironic deletes it afterwards);
//! - `baremetal node deploy` → `active`, and → the test OS's marker (with the image's root
//!   UUID) on the node's console;
//! - Ironic's VmRSS (API and conductor in one service; its master process and any workers it
//!   forks, summed over its process group): idle before the deploy, and peak, sampled every
//!   100 ms during it.
//!
//! Output: `BENCH `-prefixed lines (the script shows those). Environment (set by the script):
//! `VMDEPLOY_BIN_DIR` (the lab's binaries), `VMDEPLOY_VENV` (the venv with Ironic).

use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use vmdeploy_integration_tests::e2e::ironic::IRONIC_VERSION;
use vmdeploy_integration_tests::e2e::{Firmware, Lab, LabOptions, Peer};
use vmdeploy_integration_tests::rss::{group_rss_kib, RssSampler};
use vmdeploy_integration_tests::test_image;

/// A whole deploy under TCG on a busy 2-core machine.
const DEPLOY_LIMIT: Duration = Duration::from_secs(600);
const OS_BOOT_LIMIT: Duration = Duration::from_secs(180);

fn loadavg() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .map(|s| s.split_whitespace().take(3).collect::<Vec<_>>().join(" "))
        .unwrap_or_else(|e| format!("? ({e})"))
}

/// The largest file under `dir`, recursively (0 when there is none).
fn largest_file(dir: &Path) -> u64 {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return 0;
    };
    entries
        .filter_map(|e| e.ok())
        .map(|e| match e.file_type() {
            Ok(t) if t.is_dir() => largest_file(&e.path()),
            Ok(t) if t.is_file() => e.metadata().map_or(0, |m| m.len()),
            _ => 0,
        })
        .max()
        .unwrap_or(0)
}

fn main() {
    let image = test_image::ensure();
    println!(
        "BENCH Ironic {IRONIC_VERSION} interop: standalone Ironic, our ramdisk, TCG, BIOS (SeaBIOS), 512 MiB node; load average before: {}",
        loadavg()
    );
    let lab = Lab::start(
        "bench_ironic",
        LabOptions {
            peer: Peer::Ironic,
            callback_timeout_secs: 900,
            ..LabOptions::default()
        },
    );
    let node = lab.enroll_redfish("bench-ironic", Firmware::Bios);
    let disk = lab.publish("test-os.raw", &image.disk_raw);
    lab.set_ironic_whole_disk_image(&node, &disk, "local");
    let pid = lab.conductor_pid().expect("Ironic's pid");
    let idle_rss = group_rss_kib(pid).expect("Ironic's VmRSS");

    // The ISO Ironic builds lives in its HTTP root only while the deploy runs.
    let stop = Arc::new(AtomicBool::new(false));
    let iso_bytes = Arc::new(AtomicU64::new(0));
    let watcher = {
        let (stop, iso_bytes) = (stop.clone(), iso_bytes.clone());
        let redfish = lab.ironic_http_root().join("redfish");
        std::thread::spawn(move || {
            while !stop.load(Ordering::Relaxed) {
                iso_bytes.fetch_max(largest_file(&redfish), Ordering::Relaxed);
                std::thread::sleep(Duration::from_millis(200));
            }
        })
    };
    let sampler = RssSampler::start_group(pid);
    let started = Instant::now();
    lab.bm(&["node", "deploy", &node]);
    let shown = lab.wait_state(&node, "active", DEPLOY_LIMIT);
    let to_active = started.elapsed().as_secs_f64();
    assert_eq!(shown["last_error"], serde_json::Value::Null, "{shown}");
    lab.wait_console(&image.marker(&image.disk_root_uuid), 1, OS_BOOT_LIMIT);
    let to_marker = started.elapsed().as_secs_f64();
    let peak_rss = sampler.peak();
    stop.store(true, Ordering::Relaxed);
    let _ = watcher.join();
    let iso = iso_bytes.load(Ordering::Relaxed);
    assert!(
        iso > 0,
        "no ISO showed under Ironic's HTTP root during the deploy"
    );

    println!("BENCH");
    println!("BENCH {:<52} {:>12}", "measure", "value");
    println!(
        "BENCH {:<52} {:>9.1} MiB",
        "virtual-media ISO Ironic built around our ramdisk",
        iso as f64 / (1024.0 * 1024.0)
    );
    println!(
        "BENCH {:<52} {:>10.1} s",
        "node deploy -> active", to_active
    );
    println!(
        "BENCH {:<52} {:>10.1} s",
        "node deploy -> the test OS's marker", to_marker
    );
    println!(
        "BENCH {:<52} {:>8} KiB",
        "Ironic VmRSS idle (API + conductor, process group)", idle_rss
    );
    println!(
        "BENCH {:<52} {:>8} KiB",
        "Ironic VmRSS peak during the deploy", peak_rss
    );
    println!("BENCH load average after: {}", loadavg());
}
