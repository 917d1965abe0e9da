//! Our agent's iSCSI target as a process (`vmdeploy-agent iscsi-target`): the target the
//! iSCSI ramdisk runs, serving a disk as LUN 1, for tests that play the ramdisk themselves or
//! need a target for the conductor's initiator. Killed when dropped.

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use crate::child::ChildGuard;
use crate::{bin, free_port, tcp_listening};

/// How long the target may take to listen.
const LISTEN_WAIT: Duration = Duration::from_secs(20);

/// A running `vmdeploy-agent iscsi-target`.
pub struct AgentTarget {
    child: ChildGuard,
    /// `127.0.0.1:PORT` of its portal.
    pub portal: String,
    /// The port it waits for `done` on.
    pub done_port: u16,
}

impl AgentTarget {
    /// Serves `disk` as `iqn` on free loopback ports (the portal and the `done` listener,
    /// which otherwise defaults to port 10000).
    pub fn start(disk: &Path, iqn: &str) -> AgentTarget {
        AgentTarget::start_on(disk, iqn, free_port(), free_port(), None)
    }

    /// Serves `disk` as `iqn` on `port`, waiting for `done` on `done_port`, requiring CHAP
    /// `USER:SECRET` when `chap` is given; returns once both ports listen.
    pub fn start_on(
        disk: &Path,
        iqn: &str,
        port: u16,
        done_port: u16,
        chap: Option<&str>,
    ) -> AgentTarget {
        let portal = format!("127.0.0.1:{port}");
        let mut cmd = Command::new(bin("vmdeploy-agent"));
        cmd.args(["iscsi-target", "--disk"])
            .arg(disk)
            .args(["--iqn", iqn, "--listen", &portal])
            .args(["--done-listen", &format!("127.0.0.1:{done_port}")])
            .env("RUST_LOG", "warn")
            .stdin(Stdio::null());
        if let Some(chap) = chap {
            cmd.args(["--chap", chap]);
        }
        let child = cmd
            .spawn()
            .expect("starting vmdeploy-agent iscsi-target (fix: cargo build --workspace --bins)");
        let mut target = AgentTarget {
            child: ChildGuard::new(child),
            portal,
            done_port,
        };
        let started = Instant::now();
        while !(tcp_listening(port) && tcp_listening(done_port)) {
            if let Ok(Some(status)) = target.child.try_wait() {
                panic!("the agent target exited before it listened: {status}");
            }
            assert!(
                started.elapsed() < LISTEN_WAIT,
                "the agent target did not listen on {} and {done_port} within {LISTEN_WAIT:?}",
                target.portal
            );
            std::thread::sleep(Duration::from_millis(10));
        }
        target
    }
}
