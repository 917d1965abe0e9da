//! The end of the agent: power off or reboot through reboot(2) as PID 1, exit otherwise.

use std::time::Duration;

use nix::sys::reboot::{reboot, RebootMode};

use super::{is_pid1, FinalAction};

/// Ends the agent: as PID 1, sync and `reboot(2)`; as an ordinary process, exit 0 after logging
/// what PID 1 would have done.
pub fn finish(action: FinalAction) -> ! {
    if !is_pid1() {
        tracing::info!(?action, "not PID 1: exiting instead");
        std::process::exit(0)
    }
    tracing::info!(?action, "syncing filesystems and ending");
    nix::unistd::sync();
    let mode = match action {
        FinalAction::PowerOff => RebootMode::RB_POWER_OFF,
        FinalAction::Reboot => RebootMode::RB_AUTOBOOT,
    };
    // reboot(2) returns only on failure (e.g. EPERM without CAP_SYS_BOOT). PID 1 must not exit
    // (the kernel would panic), so keep retrying; the conductor's power-off through iLO ends it.
    loop {
        let Err(e) = reboot(mode);
        tracing::error!(?action, error = %e, "reboot(2) failed; retrying in 10 s");
        std::thread::sleep(Duration::from_secs(10));
    }
}

/// Reports a fatal error: as PID 1, logs it, waits `timeout` (the conductor can still read the
/// console or power the node off itself), then powers off; never returns. As an ordinary
/// process: logs it and exits 1.
pub fn fail_and_wait(err: &anyhow::Error, timeout: Duration) -> ! {
    tracing::error!(error = format!("{err:#}"), "deploy agent failed");
    if !is_pid1() {
        std::process::exit(1)
    }
    tracing::error!(
        seconds = timeout.as_secs(),
        "waiting before powering off (the conductor may power the node off first)"
    );
    std::thread::sleep(timeout);
    finish(FinalAction::PowerOff)
}

/// Logs panics on the console (as PID 1 a panicking thread must leave a trace; the main thread's
/// panic is caught by [`super::run_as_init`]).
pub fn install_panic_hook() {
    std::panic::set_hook(Box::new(|info| {
        let payload = info
            .payload()
            .downcast_ref::<&str>()
            .map(|s| (*s).to_owned())
            .or_else(|| info.payload().downcast_ref::<String>().cloned())
            .unwrap_or_else(|| "(non-string panic payload)".to_owned());
        let location = info
            .location()
            .map(|l| format!("{}:{}", l.file(), l.line()))
            .unwrap_or_default();
        let thread = std::thread::current().name().unwrap_or("?").to_owned();
        tracing::error!(%payload, %location, %thread, "panic");
        eprintln!("vmdeploy-agent: panic in thread {thread} at {location}: {payload}");
    }));
}
