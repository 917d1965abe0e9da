//! The agent's PID-1 duties, for real and without a VM: `vmdeploy-agent pid1-selftest` runs as
//! PID 1 of a new PID + mount namespace (`unshare --pid --fork --mount --propagation private`),
//! mounts proc/sysfs/devtmpfs/tmpfs/configfs under a scratch root, reports the namespace's own
//! mountinfo, then calls `init::finish`. reboot(2) from PID 1 of a PID namespace ends that
//! namespace's init with SIGINT (power off) or SIGHUP (restart) (man 2 reboot), and unshare
//! re-raises the child's signal on itself, so the signal that ended unshare proves which
//! reboot(2) command the agent issued.

use std::os::unix::process::ExitStatusExt;
use std::path::Path;
use std::process::{Command, Output};

use vmdeploy_integration_tests::bin;

fn selftest(unshare_args: &[&str], root: &Path, extra: &[&str]) -> (Output, serde_json::Value) {
    let out = Command::new("unshare")
        .args(unshare_args)
        .arg(bin("vmdeploy-agent"))
        .arg("pid1-selftest")
        .arg("--mount-root")
        .arg(root)
        .args(extra)
        .output()
        .expect("running unshare (util-linux)");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let report = stdout
        .lines()
        .find(|l| l.starts_with('{'))
        .and_then(|l| serde_json::from_str(l).ok())
        .unwrap_or_else(|| {
            panic!(
                "no JSON report; status {:?}\nstdout: {stdout}\nstderr: {}",
                out.status,
                String::from_utf8_lossy(&out.stderr)
            )
        });
    (out, report)
}

const PID_NS: &[&str] = &["--pid", "--fork", "--mount", "--propagation", "private"];

fn mount_types(report: &serde_json::Value, root: &Path) -> Vec<(String, String)> {
    let root = root.to_string_lossy().into_owned();
    report["mountinfo"]
        .as_array()
        .expect("mountinfo array")
        .iter()
        .filter_map(|e| {
            let point = e[0].as_str()?;
            let fstype = e[1].as_str()?;
            let rel = point.strip_prefix(&root)?;
            Some((rel.to_owned(), fstype.to_owned()))
        })
        .collect()
}

fn host_mounts_under(root: &Path) -> Vec<String> {
    let info = std::fs::read_to_string("/proc/self/mountinfo").expect("host mountinfo");
    let root = root.to_string_lossy().into_owned();
    info.lines()
        .filter_map(|l| l.split(' ').nth(4))
        .filter(|p| p.starts_with(&root))
        .map(str::to_owned)
        .collect()
}

#[test]
fn pid1_setup_mounts_everything_and_power_off_ends_the_namespace_with_sigint() {
    let root = tempfile::tempdir().expect("scratch root");
    let (out, report) = selftest(PID_NS, root.path(), &["--action", "poweroff"]);
    assert_eq!(report["pid"], 1, "{report}");
    assert_eq!(report["is_pid1"], true);
    assert!(report["setup_error"].is_null(), "{report}");
    let mounts = mount_types(&report, root.path());
    for want in [
        ("/proc", "proc"),
        ("/sys", "sysfs"),
        ("/dev", "devtmpfs"),
        ("/run", "tmpfs"),
        ("/tmp", "tmpfs"),
    ] {
        assert!(
            mounts.contains(&(want.0.to_owned(), want.1.to_owned())),
            "{want:?} missing from the namespace's mountinfo: {mounts:?}"
        );
    }
    let configfs_mounted = mounts.contains(&("/sys/kernel/config".into(), "configfs".into()));
    for m in report["setup"]["mounts"]
        .as_array()
        .expect("mount outcomes")
    {
        if m["fstype"] == "configfs" && !configfs_available() {
            // This host's kernel has no configfs (Debian's ramdisk kernel loads it as a module
            // first): the failure is reported and does not fail the setup.
            assert!(
                m["outcome"]
                    .as_str()
                    .is_some_and(|o| o.starts_with("failed")),
                "{m}"
            );
            assert!(!configfs_mounted);
        } else {
            assert_eq!(m["outcome"], "mounted", "{m}");
        }
    }
    if configfs_available() {
        assert!(configfs_mounted, "configfs missing from {mounts:?}");
    }
    assert_eq!(
        out.status.signal(),
        Some(libc_sigint()),
        "reboot(RB_POWER_OFF) from PID 1 of a PID namespace ends it with SIGINT; got {:?}\nstderr: {}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("syncing filesystems and ending"),
        "finish() logs before reboot(2)"
    );
    // The mounts lived in the namespace only.
    assert_eq!(host_mounts_under(root.path()), Vec::<String>::new());
}

#[test]
fn pid1_reboot_ends_the_namespace_with_sighup() {
    let root = tempfile::tempdir().expect("scratch root");
    let (out, report) = selftest(PID_NS, root.path(), &["--action", "reboot"]);
    assert_eq!(report["is_pid1"], true);
    assert_eq!(out.status.signal(), Some(libc_sighup()), "{:?}", out.status);
}

#[test]
fn pid1_fatal_error_powers_off_after_its_wait() {
    let root = tempfile::tempdir().expect("scratch root");
    let (out, _) = selftest(PID_NS, root.path(), &["--action", "fail"]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("self-test failure requested"), "{stderr}");
    assert_eq!(out.status.signal(), Some(libc_sigint()), "{:?}", out.status);
}

#[test]
fn not_pid1_finish_exits_0_and_failure_exits_1() {
    // Own mount namespace (so the scratch mounts never reach the host), same PID namespace.
    let mount_ns: &[&str] = &["--mount", "--propagation", "private"];
    let root = tempfile::tempdir().expect("scratch root");
    let (out, report) = selftest(mount_ns, root.path(), &["--action", "poweroff"]);
    assert_eq!(report["is_pid1"], false);
    assert_eq!(out.status.code(), Some(0), "{:?}", out.status);
    assert!(String::from_utf8_lossy(&out.stderr).contains("not PID 1: exiting instead"));
    let (out, _) = selftest(mount_ns, root.path(), &["--action", "fail"]);
    assert_eq!(out.status.code(), Some(1), "{:?}", out.status);
    assert_eq!(host_mounts_under(root.path()), Vec::<String>::new());
}

#[test]
fn module_failures_are_reported_in_order_and_do_not_stop_the_setup() {
    let root = tempfile::tempdir().expect("scratch root");
    let mods = tempfile::tempdir().expect("modules dir");
    // Not ELF: the kernel refuses it (ENOEXEC) without loading anything.
    std::fs::write(mods.path().join("garbage.ko"), b"not a kernel module").expect("write");
    let list = mods.path().join("modules");
    std::fs::write(&list, "# test list\ngarbage.ko opt=1\nmissing.ko\n").expect("write");
    let (out, report) = selftest(
        PID_NS,
        root.path(),
        &[
            "--action",
            "poweroff",
            "--modules-file",
            &list.to_string_lossy(),
            "--modules-dir",
            &mods.path().to_string_lossy(),
        ],
    );
    let modules = report["setup"]["modules"]
        .as_array()
        .expect("module outcomes");
    assert_eq!(modules.len(), 2, "{report}");
    assert!(modules[0]["path"]
        .as_str()
        .is_some_and(|p| p.ends_with("garbage.ko")));
    assert!(
        modules[0]["outcome"]
            .as_str()
            .is_some_and(|o| o.starts_with("failed: the kernel refused the module")),
        "{}",
        modules[0]
    );
    assert!(
        modules[1]["outcome"]
            .as_str()
            .is_some_and(|o| o.starts_with("failed: opening")),
        "{}",
        modules[1]
    );
    // The late mounts still ran after the failed modules.
    assert!(
        report["setup"]["mounts"]
            .as_array()
            .expect("mount outcomes")
            .iter()
            .any(|m| m["fstype"] == "configfs"),
        "{report}"
    );
    assert!(report["setup_error"].is_null(), "{report}");
    assert_eq!(out.status.signal(), Some(libc_sigint()));
}

#[test]
fn pid1_reaps_orphaned_children_and_without_the_reaper_they_stay_zombies() {
    let root = tempfile::tempdir().expect("scratch root");
    let (_, report) = selftest(PID_NS, root.path(), &["--action", "exit", "--orphans", "3"]);
    assert_eq!(report["zombies"], 0, "{report}");
    // Negative control: the same orphans with no reaper are left as zombies (shell + 3 sleeps).
    let (_, report) = selftest(
        PID_NS,
        root.path(),
        &["--action", "exit", "--orphans", "3", "--no-reaper"],
    );
    assert_eq!(report["zombies"], 4, "{report}");
}

/// Whether the host kernel has configfs registered (not every test host does).
fn configfs_available() -> bool {
    std::fs::read_to_string("/proc/filesystems")
        .map(|t| t.lines().any(|l| l.trim_end().ends_with("configfs")))
        .unwrap_or(false)
}

/// Linux signal numbers (signal(7), x86 and arm alike).
fn libc_sigint() -> i32 {
    2
}

fn libc_sighup() -> i32 {
    1
}
