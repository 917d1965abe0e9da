//! PID 1 duties: mounts, kernel modules, console, child reaping, power off / reboot.
//!
//! SKELETON (session 2): the signatures are fixed; the bodies are being built.

/// What the agent does once its work is over (or after a fatal error and its grace period).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FinalAction {
    /// Power the machine off (the conductor powers it on again through iLO).
    PowerOff,
    /// Reboot the machine.
    Reboot,
}

/// True when this process is the kernel's `/init`.
pub fn is_pid1() -> bool {
    std::process::id() == 1
}

/// Mounts proc/sys/devtmpfs/configfs, loads the initramfs's kernel modules, points logging at the
/// console and starts reaping children. Only for PID 1 (or when asked to, in tests).
pub fn setup_pid1() -> anyhow::Result<()> {
    anyhow::bail!("PID 1 setup is not built yet")
}

/// Ends the agent: as PID 1, sync and `reboot(2)`; as an ordinary process, exit 0 after logging
/// what PID 1 would have done.
pub fn finish(action: FinalAction) -> ! {
    tracing::info!(?action, "not PID 1: exiting instead");
    std::process::exit(0)
}
