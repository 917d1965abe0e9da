//! PID 1 duties: mounts, kernel modules, console, child reaping, power off / reboot.
//!
//! # Design
//! The kernel starts the agent as `/init` with nothing mounted. [`setup_pid1`] mounts the pseudo
//! filesystems ([`mounts`]), attaches the serial console ([`console`]), loads the initramfs's
//! kernel modules in listed order ([`modules`], list format documented there), mounts configfs
//! (a module in Debian's kernel) and starts the zombie reaper ([`reaper`]). The agent then runs
//! its deploy; [`finish`] ends it with sync + reboot(2), and [`fail_and_wait`] reports a fatal
//! error, waits, then powers off. PID 1 never exits: the kernel panics when /init does.
//!
//! The same binary runs as an ordinary process for tests: then [`finish`] exits 0 and
//! [`fail_and_wait`] exits 1. `vmdeploy-agent pid1-selftest` ([`selftest`]) runs the setup under a
//! scratch root as PID 1 of a new PID + mount namespace (`unshare`), so the mounts and reboot(2)
//! are tested for real without a VM (tests/integration/tests/agent_init.rs).
//!
//! # Limitations
//! The reaper collects every child (see [`reaper`]); the agent spawns none today.

pub mod console;
pub mod modules;
pub mod mounts;
pub mod power;
pub mod reaper;
pub mod selftest;

use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::Serialize;

pub use power::{fail_and_wait, finish, install_panic_hook};

/// What the agent does once its work is over (or after a fatal error and its grace period).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum FinalAction {
    /// Power the machine off (the conductor powers it on again through iLO).
    PowerOff,
    /// Reboot the machine.
    Reboot,
}

/// True when this process is the kernel's `/init` (or PID 1 of a PID namespace, in tests).
pub fn is_pid1() -> bool {
    std::process::id() == 1
}

/// Which parts of the PID-1 setup to run, and where.
#[derive(Debug, Clone)]
pub struct Pid1Options {
    /// Root the mount points and files are under: `/` for real; a scratch directory in tests.
    pub root: PathBuf,
    /// Put `/dev/console` on fds 0–2 (off in tests: it would write to the host's console).
    pub attach_console: bool,
    /// Module list to load; `None` skips module loading.
    pub module_list: Option<PathBuf>,
    /// `/lib/modules/<release>` the list's relative paths are under.
    pub modules_dir: PathBuf,
    /// Start the zombie reaper thread.
    pub reap_children: bool,
}

impl Pid1Options {
    /// The real thing: `/`, the console, `/etc/vmdeploy/modules`, the reaper. The console is
    /// attached only when really PID 1 (`run --pid1` on a host must keep its stdio).
    pub fn boot() -> Self {
        let release = modules::kernel_release().unwrap_or_default();
        Self {
            root: PathBuf::from("/"),
            attach_console: is_pid1(),
            module_list: Some(PathBuf::from(modules::MODULE_LIST_PATH)),
            modules_dir: Path::new("/lib/modules").join(release),
            reap_children: true,
        }
    }
}

/// What [`setup_pid1_with`] did (printed as JSON by `pid1-selftest`).
#[derive(Debug, Clone, Serialize)]
pub struct Pid1Report {
    /// Every mount tried, in order.
    pub mounts: Vec<mounts::MountOutcome>,
    /// Every module tried, in order.
    pub modules: Vec<modules::ModuleOutcome>,
    /// Problems that did not stop the setup (bad module list, console, reaper).
    pub warnings: Vec<String>,
}

/// Mounts proc/sys/devtmpfs/configfs, loads the initramfs's kernel modules, points logging at the
/// console and starts reaping children. Only for PID 1 (or when asked to, in tests).
pub fn setup_pid1() -> anyhow::Result<()> {
    setup_pid1_with(&Pid1Options::boot()).map(|_| ())
}

/// [`setup_pid1`] with explicit options. Fails only when an essential mount (proc, sysfs,
/// devtmpfs) fails; everything else is logged and reported.
pub fn setup_pid1_with(opts: &Pid1Options) -> anyhow::Result<Pid1Report> {
    install_panic_hook();
    crate::logging::init();
    crate::logging::use_uptime_clock();
    tracing::info!(root = %opts.root.display(), "vmdeploy-agent starting as init");
    let mut report = Pid1Report {
        mounts: mounts::mount_all(&opts.root, mounts::EARLY_MOUNTS),
        modules: Vec::new(),
        warnings: Vec::new(),
    };
    if opts.attach_console {
        if let Err(e) = console::attach(&opts.root.join("dev")) {
            report.warnings.push(format!("console: {e:#}"));
        }
    }
    // Said once at start: whether a partition image's local boot needs its signed chain.
    let secure_boot = crate::firmware::SecureBoot::read(
        &opts
            .root
            .join(crate::firmware::BOOT_PARAMS.trim_start_matches('/')),
    );
    tracing::info!("UEFI Secure Boot: {secure_boot}");
    if let Some(list) = &opts.module_list {
        match std::fs::read_to_string(list) {
            Ok(text) => match modules::parse_module_list(&text) {
                Ok(entries) => report.modules = modules::load_all(&opts.modules_dir, &entries),
                Err(e) => report
                    .warnings
                    .push(format!("module list {}: {e}", list.display())),
            },
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                tracing::info!(list = %list.display(), "no module list: no modules to load");
            }
            Err(e) => report
                .warnings
                .push(format!("reading module list {}: {e}", list.display())),
        }
    }
    report
        .mounts
        .extend(mounts::mount_all(&opts.root, mounts::LATE_MOUNTS));
    if opts.reap_children {
        if let Err(e) = reaper::spawn() {
            report.warnings.push(format!("starting the reaper: {e}"));
        }
    }
    for warning in &report.warnings {
        tracing::warn!(%warning, "PID 1 setup");
    }
    let failed: Vec<String> = report
        .mounts
        .iter()
        .filter(|m| m.essential && !m.ok())
        .map(|m| format!("{} on {}: {}", m.fstype, m.target.display(), m.outcome))
        .collect();
    anyhow::ensure!(failed.is_empty(), "mounting {}", failed.join("; "));
    Ok(report)
}

/// Runs the agent's body as init: a panic or an error is reported with [`fail_and_wait`] (power
/// off after `fail_timeout`), success ends with [`finish`]. Never returns.
pub fn run_as_init(
    fail_timeout: Duration,
    body: impl FnOnce() -> anyhow::Result<FinalAction>,
) -> ! {
    match std::panic::catch_unwind(std::panic::AssertUnwindSafe(body)) {
        Ok(Ok(action)) => finish(action),
        Ok(Err(err)) => fail_and_wait(&err, fail_timeout),
        Err(_) => fail_and_wait(&anyhow::anyhow!("the agent panicked"), fail_timeout),
    }
}
