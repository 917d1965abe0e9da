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

/// What the setup mounts under its root, in the agent's order: the early mounts, then configfs
/// when the kernel has it (init/mounts.rs; docs/ironic-protocols.md has no say here, the ramdisk's
/// needs do: proc, sysfs and devtmpfs for the disks, tmpfs for /run and /tmp).
fn expected_mounts() -> Vec<(String, String)> {
    let mut want: Vec<(String, String)> = [
        ("/proc", "proc"),
        ("/sys", "sysfs"),
        ("/dev", "devtmpfs"),
        ("/run", "tmpfs"),
        ("/tmp", "tmpfs"),
    ]
    .iter()
    .map(|(p, t)| ((*p).to_owned(), (*t).to_owned()))
    .collect();
    if configfs_available() {
        want.push(("/sys/kernel/config".into(), "configfs".into()));
    }
    want
}

/// One line of proc(5) mountinfo: mount point, per-mount options, fstype.
fn parse_mountinfo_line(line: &str) -> (String, Vec<String>, String) {
    let (left, right) = line
        .split_once(" - ")
        .unwrap_or_else(|| panic!("mountinfo line without separator: {line}"));
    let fields: Vec<&str> = left.split(' ').collect();
    assert!(fields.len() >= 6, "short mountinfo line: {line}");
    let fstype = right.split(' ').next().unwrap_or_default();
    (
        fields[4].to_owned(),
        fields[5].split(',').map(str::to_owned).collect(),
        fstype.to_owned(),
    )
}

#[test]
fn pid1_setup_mounts_everything_and_power_off_ends_the_namespace_with_sigint() {
    let root = tempfile::tempdir().expect("scratch root");
    let (out, report) = selftest(PID_NS, root.path(), &["--action", "poweroff"]);
    assert_eq!(report["pid"], 1, "{report}");
    assert_eq!(report["is_pid1"], true);
    assert!(report["setup_error"].is_null(), "{report}");
    // Under its root the namespace holds exactly the setup's mounts, once each, in its order.
    let mounts = mount_types(&report, root.path());
    assert_eq!(
        mounts,
        expected_mounts(),
        "the namespace's mounts under the root"
    );
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
}

#[test]
fn the_setup_mounts_once_with_its_flags_and_nowhere_but_its_root() {
    // Two setups in one mount namespace, then the namespace's own mount table (with per-mount
    // options, which the agent's report does not carry) read by the shell that ran them.
    let root = tempfile::tempdir().expect("scratch root");
    let script = r#"
        "$0" pid1-selftest --mount-root "$1" --action exit > /dev/null || exit 1
        "$0" pid1-selftest --mount-root "$1" --action exit || exit 1
        echo "--- mountinfo"
        cat /proc/self/mountinfo
    "#;
    let out = Command::new("unshare")
        .args(["--mount", "--propagation", "private", "sh", "-c", script])
        .arg(bin("vmdeploy-agent"))
        .arg(root.path())
        .output()
        .expect("running unshare (util-linux)");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{:?}\nstdout: {stdout}\nstderr: {}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    let (report, table) = stdout
        .split_once("--- mountinfo\n")
        .unwrap_or_else(|| panic!("no mount table in: {stdout}"));
    let report: serde_json::Value = report
        .lines()
        .find(|l| l.starts_with('{'))
        .map(|l| serde_json::from_str(l).expect("the second report is JSON"))
        .unwrap_or_else(|| panic!("no second report in: {stdout}"));

    // The second setup found everything in place and mounted nothing again.
    for m in report["setup"]["mounts"]
        .as_array()
        .expect("mount outcomes")
    {
        if m["fstype"] == "configfs" && !configfs_available() {
            continue;
        }
        assert_eq!(m["outcome"], "already mounted", "second setup: {m}");
    }

    let root_text = root.path().to_string_lossy().into_owned();
    let entries: Vec<_> = table.lines().map(parse_mountinfo_line).collect();
    // Under the root: each mount once, in order, nosuid everywhere, nodev except on /dev
    // (devtmpfs exists to give device nodes).
    let under: Vec<_> = entries
        .iter()
        .filter_map(|(point, opts, fstype)| {
            point
                .strip_prefix(&root_text)
                .map(|rel| (rel.to_owned(), opts, fstype.clone()))
        })
        .collect();
    let kinds: Vec<(String, String)> = under
        .iter()
        .map(|(p, _, t)| (p.clone(), t.clone()))
        .collect();
    assert_eq!(kinds, expected_mounts(), "mounts under the root: {table}");
    for (point, opts, fstype) in &under {
        assert!(
            opts.iter().any(|o| o == "nosuid"),
            "{point} ({fstype}) lacks nosuid: {opts:?}"
        );
        let nodev = opts.iter().any(|o| o == "nodev");
        assert_eq!(
            nodev,
            fstype != "devtmpfs",
            "{point} ({fstype}): nodev is {nodev}, options {opts:?}"
        );
    }

    // Elsewhere: nothing the host's table does not have (the namespace started as its copy).
    let host = std::fs::read_to_string("/proc/self/mountinfo").expect("host mountinfo");
    let host: Vec<(String, String)> = host
        .lines()
        .map(parse_mountinfo_line)
        .map(|(p, _, t)| (p, t))
        .collect();
    let ns: Vec<(String, String)> = entries
        .iter()
        .map(|(p, _, t)| (p.clone(), t.clone()))
        .collect();
    for (point, fstype) in ns.iter().filter(|(p, _)| !p.starts_with(&root_text)) {
        let count =
            |v: &[(String, String)]| v.iter().filter(|(p, t)| p == point && t == fstype).count();
        assert!(
            count(&ns) <= count(&host),
            "the setup mounted {fstype} on {point}, outside its root"
        );
    }
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
