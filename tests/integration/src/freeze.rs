//! Holding a child process still to check a state it passes through in a few milliseconds,
//! such as "the agent has closed its iSCSI port but not exited yet".
//!
//! A check made after the process exited proves nothing about the process (the kernel closes
//! every socket at exit). [`stop`] holds a process with SIGSTOP at a known point; then
//! [`check_at_exit`] lets it run to its end under ptrace(2) with `PTRACE_O_TRACEEXIT`, which
//! stops its main thread inside exit(2) *before* the kernel closes its files, and checks the
//! condition there. That instant is the last one the process has, whatever the machine's load:
//! an earlier version stepped the process with SIGCONT, a 300 µs sleep and SIGSTOP, and on a
//! busy machine a "300 µs" step could run the process from its listening state straight through
//! its exit.

use std::time::{Duration, Instant};

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

/// With `pid` stopped (see [`stop`]): lets it run to its exit and evaluates `cond` at the
/// moment its main thread enters exit, while every file it holds (its sockets among them) is
/// still open; then lets it finish. Returns what `cond` said there.
///
/// The process must end by its main thread calling exit (returning from `main`, or
/// `std::process::exit` on the main thread); panics if it dies otherwise, or is still running
/// after `limit`. The caller still reaps it (`Child::wait`).
pub fn check_at_exit(pid: u32, limit: Duration, cond: impl FnOnce() -> bool) -> bool {
    let tid = libc::pid_t::try_from(pid).expect("a pid fits pid_t");
    // SAFETY: ptrace(2) with PTRACE_SEIZE takes no pointers (addr 0, data the option bits).
    let rc = unsafe {
        libc::ptrace(
            libc::PTRACE_SEIZE,
            tid,
            std::ptr::null_mut::<libc::c_void>(),
            libc::PTRACE_O_TRACEEXIT as usize as *mut libc::c_void,
        )
    };
    assert!(
        rc == 0,
        "ptrace(PTRACE_SEIZE, {pid}): {} (fix: run the tests as a user allowed to trace its own \
         children: kernel.yama.ptrace_scope <= 1 and no seccomp filter that denies ptrace)",
        std::io::Error::last_os_error()
    );
    resume(pid);
    let deadline = Instant::now() + limit;
    loop {
        let mut status: libc::c_int = 0;
        // SAFETY: `status` is a valid out-pointer for the call's duration.
        let got = unsafe { libc::waitpid(tid, &mut status, libc::__WALL | libc::WNOHANG) };
        if got == 0 {
            if Instant::now() >= deadline {
                // SIGKILL ends a traced process too; the caller's wait reaps it.
                signal(pid, libc::SIGKILL);
                panic!("process {pid} did not reach its exit within {limit:?}");
            }
            std::thread::sleep(Duration::from_millis(1));
            continue;
        }
        assert!(
            got == tid,
            "waitpid({pid}): {}",
            std::io::Error::last_os_error()
        );
        assert!(
            libc::WIFSTOPPED(status),
            "process {pid} ended without stopping at its exit (status {status:#x}): its main \
             thread did not call exit"
        );
        let event = status >> 16;
        if event == libc::PTRACE_EVENT_EXIT {
            let held = cond();
            detach(tid);
            return held;
        }
        // Anything else: a group-stop (our SIGCONT ends it) or a signal on its way. Let the
        // process go on, delivering the signal unless it is a stop (the caller wants it to run).
        let signal_to_deliver = match libc::WSTOPSIG(status) {
            _ if event == libc::PTRACE_EVENT_STOP => 0,
            libc::SIGSTOP | libc::SIGTSTP | libc::SIGTTIN | libc::SIGTTOU => 0,
            other => other,
        };
        // SAFETY: ptrace(2) PTRACE_CONT takes no pointers; data is the signal number.
        let rc = unsafe {
            libc::ptrace(
                libc::PTRACE_CONT,
                tid,
                std::ptr::null_mut::<libc::c_void>(),
                signal_to_deliver as usize as *mut libc::c_void,
            )
        };
        assert!(
            rc == 0,
            "ptrace(PTRACE_CONT, {pid}): {}",
            std::io::Error::last_os_error()
        );
    }
}

fn detach(tid: libc::pid_t) {
    // SAFETY: ptrace(2) PTRACE_DETACH takes no pointers (addr ignored, data 0: no signal).
    let rc = unsafe {
        libc::ptrace(
            libc::PTRACE_DETACH,
            tid,
            std::ptr::null_mut::<libc::c_void>(),
            std::ptr::null_mut::<libc::c_void>(),
        )
    };
    assert!(
        rc == 0,
        "ptrace(PTRACE_DETACH, {tid}): {}",
        std::io::Error::last_os_error()
    );
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::process::{Command, Stdio};

    /// A python3 child that listens on a port, stops itself, and on SIGCONT either closes the
    /// socket before exiting or exits with it open.
    fn listener(close_first: bool) -> (std::process::Child, u16) {
        let script = format!(
            "import os, signal, socket\n\
             s = socket.socket(); s.bind(('127.0.0.1', 0)); s.listen()\n\
             print(s.getsockname()[1], flush=True)\n\
             os.kill(os.getpid(), signal.SIGSTOP)\n\
             {}os._exit(0)\n",
            if close_first { "s.close()\n" } else { "" }
        );
        let mut child = Command::new("python3")
            .args(["-c", &script])
            .stdout(Stdio::piped())
            .spawn()
            .expect("python3 runs (fix: apt-get install python3)");
        let mut line = String::new();
        std::io::BufRead::read_line(
            &mut std::io::BufReader::new(child.stdout.take().expect("stdout")),
            &mut line,
        )
        .expect("reading the port");
        let port = line.trim().parse().expect("python3 printed its port");
        (child, port)
    }

    fn run(close_first: bool) -> bool {
        let (mut child, port) = listener(close_first);
        stop(child.id());
        assert!(crate::tcp_listening(port), "the child listens on {port}");
        let closed = check_at_exit(child.id(), Duration::from_secs(30), || {
            !crate::tcp_listening(port)
        });
        let status = child.wait().expect("reaping the child");
        assert!(status.success(), "{status}");
        closed
    }

    #[test]
    fn a_socket_closed_before_exit_is_seen_closed() {
        assert!(run(true));
    }

    #[test]
    fn a_socket_left_open_is_still_open_at_the_exit_stop() {
        assert!(!run(false));
    }
}
