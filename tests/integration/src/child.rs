//! The one guard of every process a test starts: killed and reaped when the guard drops, also
//! when the test fails, so that no peer outlives its test and holds a port, a loop device or a
//! lock the next test needs.
//!
//! A guard may know the file its process logs to; when the guard drops during a panic it prints
//! the log's tail, which is where a failed test's reason usually is. A guard may also own its
//! process group (a peer started as a group leader, whose workers are its children): then the
//! whole group is killed.
//!
//! The guard dereferences to its [`Child`], so `try_wait`, `id` and the pipes are used as on the
//! child itself.

use std::ops::{Deref, DerefMut};
use std::path::{Path, PathBuf};
use std::process::{Child, ExitStatus, Output};
use std::time::{Duration, Instant};

/// How many lines of the log a failing test prints.
const LOG_TAIL_LINES: usize = 200;

/// A child process killed (and reaped) on drop.
pub struct ChildGuard {
    /// `None` only after [`ChildGuard::wait_with_output`] took it, which consumes the guard.
    child: Option<Child>,
    /// Printed (its tail) when the guard drops during a panic.
    log: Option<(String, PathBuf)>,
    /// Kill the child's process group too, when it leads one.
    group: bool,
}

impl ChildGuard {
    /// Guards `child`.
    pub fn new(child: Child) -> ChildGuard {
        ChildGuard {
            child: Some(child),
            log: None,
            group: false,
        }
    }

    /// Prints the tail of `path`, titled `name`, when the guard drops during a panic.
    pub fn with_log(mut self, name: &str, path: &Path) -> ChildGuard {
        self.log = Some((name.to_owned(), path.to_path_buf()));
        self
    }

    /// Kills the child's whole process group as well, when the child leads one (a service whose
    /// workers are its children).
    pub fn killing_group(mut self) -> ChildGuard {
        self.group = true;
        self
    }

    /// The child's log so far (empty without one, or when it cannot be read).
    pub fn log(&self) -> String {
        self.log
            .as_ref()
            .and_then(|(_, path)| std::fs::read_to_string(path).ok())
            .unwrap_or_default()
    }

    /// Kills the child now (SIGKILL, as a crash would) and reaps it; a no-op once it has exited.
    pub fn kill(&mut self) {
        let group = self.group;
        if let Some(child) = self.child.as_mut() {
            // Only while it runs: a reaped child's id may name another process by now.
            if group && matches!(child.try_wait(), Ok(None)) {
                kill_group(child.id());
            }
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Whether the child still runs (has not exited).
    pub fn is_running(&mut self) -> bool {
        self.child
            .as_mut()
            .is_some_and(|c| matches!(c.try_wait(), Ok(None)))
    }

    /// The child's exit status, when it exits within `limit`; `None` when it still runs then.
    pub fn wait_exit(&mut self, limit: Duration) -> Option<ExitStatus> {
        let started = Instant::now();
        loop {
            if let Ok(Some(status)) = self.deref_mut().try_wait() {
                return Some(status);
            }
            if started.elapsed() >= limit {
                return None;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// Waits for the child's exit and collects its piped output (the guard is used up).
    pub fn wait_with_output(mut self) -> std::io::Result<Output> {
        let child = self
            .child
            .take()
            .expect("the guard holds its child until it is used up");
        child.wait_with_output()
    }
}

impl Deref for ChildGuard {
    type Target = Child;

    fn deref(&self) -> &Child {
        self.child
            .as_ref()
            .expect("the guard holds its child until it is used up")
    }
}

impl DerefMut for ChildGuard {
    fn deref_mut(&mut self) -> &mut Child {
        self.child
            .as_mut()
            .expect("the guard holds its child until it is used up")
    }
}

impl Drop for ChildGuard {
    fn drop(&mut self) {
        self.kill();
        if std::thread::panicking() {
            if let Some((name, path)) = &self.log {
                eprintln!(
                    "--- {name} log ({}), last {LOG_TAIL_LINES} lines ---\n{}\n--- end ---",
                    path.display(),
                    tail(&self.log(), LOG_TAIL_LINES)
                );
            }
        }
    }
}

/// The last `n` lines of `text`.
pub fn tail(text: &str, n: usize) -> String {
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(n)..].join("\n")
}

/// SIGKILL to the process group `pid` leads, when it leads one.
fn kill_group(pid: u32) {
    let Ok(pid) = libc::pid_t::try_from(pid) else {
        return;
    };
    // SAFETY: getpgid takes a plain integer and touches no memory of ours.
    if unsafe { libc::getpgid(pid) } == pid {
        // SAFETY: as above; the group is the child's own (it leads it).
        unsafe { libc::kill(-pid, libc::SIGKILL) };
    }
}
