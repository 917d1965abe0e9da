//! `vmdeploy-agent pid1-selftest` (hidden): runs the PID-1 setup under a scratch root, prints a
//! JSON report on stdout and ends with the requested action. Meant to run as PID 1 of a new PID
//! and mount namespace (`unshare --pid --fork --mount --propagation private`), where reboot(2)
//! ends the namespace's init instead of the machine (reboot(2): the parent sees SIGINT for power
//! off, SIGHUP for restart). tests/integration/tests/agent_init.rs drives it.

use std::io::Write as _;
use std::path::PathBuf;

use anyhow::Context as _;
use serde::Serialize;

use super::{finish, mounts, setup_pid1_with, FinalAction, Pid1Options, Pid1Report};

/// How the self-test ends.
#[derive(Debug, Clone, Copy, clap::ValueEnum)]
pub enum SelftestEnd {
    /// `finish(PowerOff)`.
    Poweroff,
    /// `finish(Reboot)`.
    Reboot,
    /// `fail_and_wait` with a zero timeout (PID 1: power off; otherwise exit 1).
    Fail,
    /// Plain exit 0 (no reboot(2)).
    Exit,
}

/// Arguments of `pid1-selftest`.
#[derive(Debug, clap::Args)]
pub struct Pid1SelftestArgs {
    /// Scratch root under which proc, sys, dev, run, tmp and configfs are mounted.
    #[arg(long)]
    pub mount_root: PathBuf,
    /// Module list to load (format: init::modules); none by default.
    #[arg(long)]
    pub modules_file: Option<PathBuf>,
    /// Directory the list's relative paths are under.
    #[arg(long, default_value = "/nonexistent")]
    pub modules_dir: PathBuf,
    /// How to end.
    #[arg(long, value_enum, default_value = "poweroff")]
    pub action: SelftestEnd,
    /// Leave this many orphaned children behind (a shell that starts short sleeps and exits),
    /// then count zombies a second later: proves the reaper.
    #[arg(long, default_value_t = 0)]
    pub orphans: u32,
    /// Do not start the reaper (the negative control for `--orphans`).
    #[arg(long)]
    pub no_reaper: bool,
}

#[derive(Serialize)]
struct SelftestReport {
    pid: u32,
    is_pid1: bool,
    setup: Option<Pid1Report>,
    setup_error: Option<String>,
    /// `(mount point, fstype)` from `<root>/proc/self/mountinfo` after the setup: the namespace's
    /// own view, read through the proc the setup mounted.
    mountinfo: Vec<(String, String)>,
    /// Zombie processes in the namespace one second after `--orphans` were left behind.
    zombies: Option<usize>,
}

/// Starts `sh`, which starts `count` short sleeps and exits at once: the sleeps are re-parented
/// to PID 1, and the shell itself is never waited on by us (only the reaper can collect it).
fn leave_orphans(count: u32) -> anyhow::Result<()> {
    let script = "sleep 0.1 & ".repeat(count as usize) + "exit 0";
    let child = std::process::Command::new("sh")
        .arg("-c")
        .arg(script)
        .spawn()
        .context("starting sh for the orphans")?;
    // Dropping `Child` does not wait for it.
    drop(child);
    Ok(())
}

/// Processes in state `Z` according to `proc_dir/<pid>/stat` (proc(5): state follows the `)`).
fn count_zombies(proc_dir: &std::path::Path) -> usize {
    let Ok(entries) = std::fs::read_dir(proc_dir) else {
        return 0;
    };
    entries
        .filter_map(Result::ok)
        .filter(|e| {
            e.file_name()
                .to_string_lossy()
                .bytes()
                .all(|b| b.is_ascii_digit())
        })
        .filter_map(|e| std::fs::read_to_string(e.path().join("stat")).ok())
        .filter(|stat| {
            stat.rsplit_once(')')
                .is_some_and(|(_, rest)| rest.trim_start().starts_with('Z'))
        })
        .count()
}

/// Runs the self-test; returns only on an error before the end action.
pub fn run(args: Pid1SelftestArgs) -> anyhow::Result<()> {
    let opts = Pid1Options {
        root: args.mount_root.clone(),
        attach_console: false,
        module_list: args.modules_file.clone(),
        modules_dir: args.modules_dir.clone(),
        reap_children: !args.no_reaper,
    };
    let (setup, setup_error) = match setup_pid1_with(&opts) {
        Ok(report) => (Some(report), None),
        Err(e) => (None, Some(format!("{e:#}"))),
    };
    let zombies = if args.orphans > 0 {
        leave_orphans(args.orphans)?;
        std::thread::sleep(std::time::Duration::from_secs(1));
        Some(count_zombies(&args.mount_root.join("proc")))
    } else {
        None
    };
    let mountinfo_path = args.mount_root.join("proc/self/mountinfo");
    let mountinfo = std::fs::read_to_string(&mountinfo_path)
        .map(|text| {
            mounts::mountinfo_entries(&text)
                .map(|(p, t)| (p.to_owned(), t.to_owned()))
                .collect()
        })
        .unwrap_or_default();
    let report = SelftestReport {
        pid: std::process::id(),
        is_pid1: super::is_pid1(),
        setup,
        setup_error,
        mountinfo,
        zombies,
    };
    let json = serde_json::to_string(&report).context("serializing the self-test report")?;
    let mut stdout = std::io::stdout().lock();
    writeln!(stdout, "{json}").context("writing the self-test report")?;
    stdout.flush().context("flushing the self-test report")?;
    drop(stdout);
    match args.action {
        SelftestEnd::Poweroff => finish(FinalAction::PowerOff),
        SelftestEnd::Reboot => finish(FinalAction::Reboot),
        SelftestEnd::Fail => super::fail_and_wait(
            &anyhow::anyhow!("self-test failure requested"),
            std::time::Duration::ZERO,
        ),
        SelftestEnd::Exit => Ok(()),
    }
}
