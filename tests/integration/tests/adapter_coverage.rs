//! `vmdeploy-image-build coverage` on real data: Debian's `pci.ids` and the Debian kernel
//! package scripts/setup downloads. The adapters named here are checked against the files
//! themselves (grep), not against our parser, so a parser that drops or invents entries fails.
//!
//! Needs the kernel .deb, Debian's firmware packages unpacked, `pci.ids` and kmod's `modinfo`
//! (scripts/setup provides them) and the debug `vmdeploy-image-build`.

use std::path::Path;
use std::process::Command;

use vmdeploy_integration_tests::bin;
use vmdeploy_integration_tests::deploy_iso::{firmware_dir, kernel_deb};

const PCI_IDS: &str = "/usr/share/misc/pci.ids";

fn coverage(extra: &[&str]) -> (bool, String, String) {
    assert!(
        Path::new(PCI_IDS).is_file(),
        "{PCI_IDS} is missing: run scripts/setup (apt-get install pci.ids)"
    );
    let out = Command::new(bin("vmdeploy-image-build"))
        .arg("coverage")
        .arg("--kernel-deb")
        .arg(kernel_deb())
        .args(extra)
        .output()
        .expect("running vmdeploy-image-build coverage (cargo build --workspace --bins)");
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// The number of `\t\t<subvendor> ` lines in pci.ids before its class list: every subsystem
/// the report must have read.
fn subsystem_lines() -> usize {
    let text = std::fs::read_to_string(PCI_IDS).expect("reading pci.ids");
    text.lines()
        .take_while(|l| !l.starts_with("C "))
        .filter(|l| l.starts_with("\t\t103c ") || l.starts_with("\t\t1590 "))
        .count()
}

#[test]
fn the_report_reads_every_hp_subsystem_and_debians_firmware_completes_it() {
    let (ok, out, err) = coverage(&["--list"]);
    assert!(ok, "coverage failed:\n{out}{err}");
    let expected = subsystem_lines();
    assert!(
        expected > 1000,
        "pci.ids has only {expected} HP/HPE subsystems"
    );
    assert!(
        out.contains(&format!(
            "HP/HPE subsystems (subvendor 103c, 1590): {expected};"
        )),
        "{out}"
    );
    // Every network and storage driver of the kernel is in the driver pack: without a
    // firmware tree, what is missing is firmware only.
    assert!(
        !out.contains("lacks the module"),
        "a driver is missing from the medium:\n{out}"
    );
    // The 534FLR-SFP+ (bnx2x) of the issue: its module is there, its firmware is not.
    let bnx2x = out
        .lines()
        .find(|l| l.trim_start().starts_with("bnx2x ("))
        .unwrap_or_else(|| panic!("bnx2x is not reported missing:\n{out}"));
    assert!(bnx2x.contains("lacks 6 firmware files"), "{bnx2x}");
    let pci_ids = std::fs::read_to_string(PCI_IDS).expect("reading pci.ids");
    assert!(
        pci_ids.contains("\t\t103c 1930  FlexFabric 10Gb 2-port 534FLR-SFP+ Adapter"),
        "pci.ids no longer lists the 534FLR-SFP+ as this test expects"
    );
    assert!(
        out.contains("14e4:168e 103c:1930  FlexFabric 10Gb 2-port 534FLR-SFP+ Adapter"),
        "{out}"
    );
    // The firmware file names are the module's own (modinfo), listed under --list.
    assert!(out.contains("firmware bnx2x/bnx2x-e2-"), "{out}");
    // HPE's 366FLR (i350, igb) needs no firmware: it is not among the missing.
    assert!(!out.contains("1590:00cb"), "{out}");

    // The same report with Debian's firmware packages (each run unpacks the kernel package,
    // about 10 s: one test, two runs).
    debians_firmware_covers_every_driven_adapter(&out);
}

fn debians_firmware_covers_every_driven_adapter(without: &str) {
    let firmware = firmware_dir();
    let firmware = firmware.to_str().expect("a UTF-8 checkout path");
    let (ok, out, err) = coverage(&["--firmware-dir", firmware, "--require-full"]);
    assert!(
        ok,
        "--require-full failed with Debian's firmware:\n{out}{err}"
    );
    let driven = |text: &str| -> usize {
        let at = text
            .find("driven by a network or storage driver: ")
            .unwrap_or_else(|| panic!("no driven count:\n{text}"));
        text[at..]
            .split(": ")
            .nth(1)
            .and_then(|rest| rest.split(' ').next())
            .and_then(|n| n.parse().ok())
            .unwrap_or_else(|| panic!("no driven count:\n{text}"))
    };
    let total = driven(&out);
    assert_eq!(total, driven(without), "both runs read the same adapters");
    assert!(
        out.contains(&format!(
            "on the medium (driver and every firmware file it names): {total} of {total} (100.0%)"
        )),
        "{out}"
    );
    assert!(!out.contains("missing, by driver"), "{out}");

    // Without them, --require-full fails and says why.
    let (ok, _, err) = coverage(&["--require-full"]);
    assert!(!ok, "--require-full passed with firmware missing");
    assert!(
        err.contains("driven adapters are not covered by the medium"),
        "{err}"
    );
    let (ok, _, err) = coverage(&["--pci-ids", "/nonexistent/pci.ids"]);
    assert!(!ok);
    assert!(err.contains("apt-get install pci.ids"), "{err}");
}
