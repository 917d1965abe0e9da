//! `vmdeploy-image-build coverage` on real data: Debian's `pci.ids` and the Debian kernel
//! package scripts/setup downloads. The adapters named here are checked against the files
//! themselves (grep), not against our parser, so a parser that drops or invents entries fails.
//!
//! Needs the kernel .deb, `pci.ids` and kmod's `modinfo` (scripts/setup installs them) and the
//! debug `vmdeploy-image-build`.

use std::path::Path;
use std::process::Command;

use vmdeploy_integration_tests::{bin, deploy_iso::kernel_deb};

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
fn the_report_reads_every_hp_subsystem_and_a_driver_added_raises_it() {
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
    // The 534FLR-SFP+ (bnx2x) of the issue: not on today's ISO, and its firmware with it.
    let bnx2x = out
        .lines()
        .find(|l| l.trim_start().starts_with("bnx2x ("))
        .unwrap_or_else(|| panic!("bnx2x is not reported missing:\n{out}"));
    assert!(
        bnx2x.contains("lacks the module and") && bnx2x.contains("firmware files"),
        "{bnx2x}"
    );
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
    // HPE's 366FLR (i350, igb) is on the ISO, so it is not among the missing.
    assert!(!out.contains("1590:00cb"), "{out}");

    // The same report with bnxt_en on the medium (each run unpacks the kernel package, about
    // 10 s: one test, two runs).
    adding_a_driver_moves_its_adapters_and_require_full_fails_while_any_is_missing(&out);
}

fn adding_a_driver_moves_its_adapters_and_require_full_fails_while_any_is_missing(without: &str) {
    let (ok, out, err) = coverage(&["--module", "bnxt_en", "--require-full"]);
    assert!(!ok, "--require-full passed with adapters missing:\n{out}");
    assert!(
        err.contains("driven adapters are not covered by the medium"),
        "{err}"
    );
    // bnxt_en (631FLR) names no firmware: with the module it is covered.
    assert!(!out.contains("bnxt_en ("), "{out}");
    let percent = |text: &str| -> f64 {
        let line = text
            .lines()
            .find(|l| l.contains("on the medium"))
            .unwrap_or_else(|| panic!("no coverage line:\n{text}"));
        let open = line.rfind('(').expect("a percentage");
        line[open + 1..]
            .trim_end_matches("%)")
            .parse()
            .unwrap_or_else(|e| panic!("{line}: {e}"))
    };
    assert!(
        percent(&out) > percent(without),
        "adding bnxt_en did not raise the coverage:\n{without}\n{out}"
    );
    let (ok, _, err) = coverage(&["--pci-ids", "/nonexistent/pci.ids"]);
    assert!(!ok);
    assert!(err.contains("apt-get install pci.ids"), "{err}");
}
