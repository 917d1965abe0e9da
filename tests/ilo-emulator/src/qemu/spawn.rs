//! Starting QEMU so that it never outlives the emulator.
//!
//! # Design
//! Each child asks the kernel for SIGKILL when its parent dies (`PR_SET_PDEATHSIG`, set between
//! fork and exec). The "parent" of that rule is the *thread* that forked, not the process: a
//! child forked from a tokio worker or blocking-pool thread would be killed when that thread
//! retires. So every QEMU is forked by one dedicated thread that lives as long as the process.
//! The backend also kills its QEMU on power-off and on drop; the death signal covers a crash or a
//! SIGKILL of the emulator itself.

use std::io;
use std::os::unix::process::CommandExt;
use std::process::{Child, Command};
use std::sync::mpsc;
use std::sync::{Mutex, OnceLock};
use vmdeploy_shared::error::Chain;

type Request = (Command, mpsc::Sender<io::Result<Child>>);

fn spawner() -> &'static Mutex<mpsc::Sender<Request>> {
    static SPAWNER: OnceLock<Mutex<mpsc::Sender<Request>>> = OnceLock::new();
    SPAWNER.get_or_init(|| {
        let (tx, rx) = mpsc::channel::<Request>();
        std::thread::Builder::new()
            .name("qemu-spawner".into())
            .spawn(move || {
                // The sender lives in a static: this loop (and the thread) ends with the process.
                for (mut cmd, reply) in rx {
                    let _ = reply.send(spawn_here(&mut cmd));
                }
            })
            .map(|_| ())
            .unwrap_or_else(
                |e| tracing::error!(error = %Chain(&e), "cannot start the QEMU spawner thread"),
            );
        Mutex::new(tx)
    })
}

fn spawn_here(cmd: &mut Command) -> io::Result<Child> {
    let parent = std::process::id();
    // SAFETY: the closure runs in the forked child before exec; it only calls prctl(2) and
    // getppid(2), both async-signal-safe, and allocates nothing.
    unsafe {
        cmd.pre_exec(move || {
            nix::sys::prctl::set_pdeathsig(nix::sys::signal::Signal::SIGKILL)
                .map_err(io::Error::from)?;
            // The parent may have died between fork and prctl: then nobody would kill us.
            if nix::unistd::getppid().as_raw() as u32 != parent {
                return Err(io::Error::other("the emulator exited while QEMU started"));
            }
            Ok(())
        });
    }
    cmd.spawn()
}

/// Spawns `cmd` from the long-lived spawner thread with a parent-death SIGKILL.
pub fn spawn_tied(cmd: Command) -> io::Result<Child> {
    let (tx, rx) = mpsc::channel();
    spawner()
        .lock()
        .map_err(|_| io::Error::other("the QEMU spawner lock is poisoned"))?
        .send((cmd, tx))
        .map_err(|_| io::Error::other("the QEMU spawner thread is gone"))?;
    rx.recv()
        .map_err(|_| io::Error::other("the QEMU spawner thread did not answer"))?
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn spawns_from_the_spawner_thread_and_reports_errors() {
        let mut child = spawn_tied(Command::new("true")).expect("spawning true");
        assert!(child.wait().expect("wait").success());
        let missing = spawn_tied(Command::new("/nonexistent/qemu"));
        assert_eq!(
            missing.err().map(|e| e.kind()),
            Some(io::ErrorKind::NotFound)
        );
    }
}
