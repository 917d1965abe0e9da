//! Reaping: PID 1 inherits every orphan, and their zombies must not pile up.
//!
//! Limitation: the reaper calls `waitpid(-1)`, so it would also collect the exit status of a child
//! the agent itself spawned and waits on (`Command::wait` would then fail with ECHILD). The agent
//! spawns no processes today (everything, iSCSI target included, is in-process). If it ever does,
//! replace this with a registry of pids the agent waits on itself.

use std::time::Duration;

use nix::errno::Errno;
use nix::sys::wait::{waitpid, WaitStatus};
use nix::unistd::Pid;

/// How long to sleep when there is no child at all (waitpid returns ECHILD at once).
const IDLE_POLL: Duration = Duration::from_millis(500);

/// Starts the reaper thread (it runs for the life of the process).
pub fn spawn() -> std::io::Result<()> {
    std::thread::Builder::new()
        .name("reaper".into())
        .spawn(|| loop {
            match waitpid(Pid::from_raw(-1), None) {
                Ok(WaitStatus::Exited(pid, code)) => {
                    tracing::debug!(%pid, code, "reaped child");
                }
                Ok(WaitStatus::Signaled(pid, signal, _)) => {
                    tracing::debug!(%pid, ?signal, "reaped child");
                }
                Ok(_) | Err(Errno::EINTR) => {}
                Err(Errno::ECHILD) => std::thread::sleep(IDLE_POLL),
                Err(e) => {
                    tracing::warn!(error = %e, "waitpid failed");
                    std::thread::sleep(IDLE_POLL);
                }
            }
        })
        .map(|_| ())
}
