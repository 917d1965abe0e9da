//! Holding a child process still (SIGSTOP) to check a state it passes through in a few
//! milliseconds, such as "the agent has closed its iSCSI port but not exited yet".
//!
//! A check made after the process exited proves nothing about the process (the kernel closes
//! every socket at exit). Here the process is stopped, allowed to run in short steps
//! (SIGCONT, a sleep, SIGSTOP), and the condition is checked after every step while it is
//! stopped: when the condition holds, the process was alive when it did.

use std::time::{Duration, Instant};

/// How long the process runs between two looks.
const STEP: Duration = Duration::from_micros(300);

/// What [`step_until`] saw.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stepped {
    /// The condition held while the process was stopped (and so alive). It is left stopped.
    HeldWhileAlive,
    /// The process exited before the condition held.
    ExitedFirst,
}

/// Where a process is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Liveness {
    Stopped,
    Exited,
}

/// The state letter of each thread of `pid` (proc(5): the field after the `)` of the name).
fn thread_states(pid: u32) -> Vec<char> {
    let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
        return Vec::new();
    };
    tasks
        .filter_map(Result::ok)
        .filter_map(|t| std::fs::read_to_string(t.path().join("stat")).ok())
        .filter_map(|stat| {
            let (_, rest) = stat.rsplit_once(')')?;
            rest.trim_start().chars().next()
        })
        .collect()
}

fn main_state(pid: u32) -> Option<char> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let (_, rest) = stat.rsplit_once(')')?;
    rest.trim_start().chars().next()
}

fn signal(pid: u32, sig: libc::c_int) {
    let pid = libc::pid_t::try_from(pid).expect("a pid fits pid_t");
    // SAFETY: kill(2) has no memory preconditions; `pid` is our own child, not yet reaped.
    let rc = unsafe { libc::kill(pid, sig) };
    assert!(
        rc == 0,
        "kill({pid}, {sig}): {}",
        std::io::Error::last_os_error()
    );
}

/// Sends SIGSTOP and waits until every thread has stopped, or the process has exited.
fn stop_and_wait(pid: u32) -> Liveness {
    signal(pid, libc::SIGSTOP);
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        match main_state(pid) {
            None | Some('Z' | 'X') => return Liveness::Exited,
            Some(_) => {
                let states = thread_states(pid);
                if !states.is_empty() && states.iter().all(|s| matches!(s, 'T' | 't')) {
                    return Liveness::Stopped;
                }
            }
        }
        assert!(
            Instant::now() < deadline,
            "process {pid} neither stopped nor exited within 10 s of SIGSTOP"
        );
        std::thread::yield_now();
    }
}

/// Stops `pid` (a child of this process that has not been waited for).
pub fn stop(pid: u32) {
    assert_eq!(
        stop_and_wait(pid),
        Liveness::Stopped,
        "process {pid} had exited before it could be stopped"
    );
}

/// Lets a stopped `pid` carry on.
pub fn resume(pid: u32) {
    signal(pid, libc::SIGCONT);
}

/// With `pid` stopped (see [`stop`]): checks `cond`, and while it does not hold lets the
/// process run one short step and checks again, until it holds, the process exits, or `limit`
/// passes (a panic).
pub fn step_until(pid: u32, limit: Duration, mut cond: impl FnMut() -> bool) -> Stepped {
    let deadline = Instant::now() + limit;
    loop {
        if cond() {
            return Stepped::HeldWhileAlive;
        }
        assert!(
            Instant::now() < deadline,
            "the condition did not hold within {limit:?} of stepping process {pid}"
        );
        resume(pid);
        std::thread::sleep(STEP);
        if stop_and_wait(pid) == Liveness::Exited {
            return Stepped::ExitedFirst;
        }
    }
}
