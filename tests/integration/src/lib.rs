//! Shared helpers for vmdeploy's integration tests: locating the built binaries and the Python
//! peers, free loopback ports, loop devices, locks on shared names, and starting real peers
//! (tgtd, Swift, sushy-tools) on loopback.
//!
//! The test command (`scripts/test`) builds every binary before the tests run; a test that cannot
//! find one fails with a message that says how to build it.

pub mod sushy;
pub mod swift;
pub mod tgt;

pub mod agent_target;
pub mod baremetal;
pub mod child;
pub mod conductor_env;
pub mod deploy_iso;
pub mod disk_check;
pub mod e2e;
pub mod emulator;
pub mod fake_ramdisk;
pub mod fault;
pub mod fleet;
pub mod freeze;
pub mod front_door;
pub mod http;
pub mod ipa_standin;
pub mod ironic_standalone;
pub mod iscsi_standin;
pub mod lock;
pub mod loopdev;
pub mod qemu;
pub mod rss;
pub mod test_image;
pub mod tools;

use std::net::TcpListener;
use std::path::{Path, PathBuf};

/// The workspace root (two levels above this crate).
pub fn workspace_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../..")
        .canonicalize()
        .expect("the workspace root exists: this crate is inside it")
}

/// Path of a workspace binary built by `cargo build --workspace --bins` (debug profile), honouring
/// `CARGO_TARGET_DIR`; `VMDEPLOY_BIN_DIR` names another directory (the benches' release builds).
pub fn bin(name: &str) -> PathBuf {
    let dir = std::env::var_os("VMDEPLOY_BIN_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            std::env::var_os("CARGO_TARGET_DIR")
                .map(PathBuf::from)
                .unwrap_or_else(|| workspace_root().join("target"))
                .join("debug")
        });
    let path = dir.join(name);
    assert!(
        path.exists(),
        "{} is missing: run `cargo build --workspace --bins` first (scripts/test does)",
        path.display()
    );
    path
}

/// The Python venv made by `scripts/setup` (or `VMDEPLOY_VENV`).
pub fn venv() -> PathBuf {
    std::env::var_os("VMDEPLOY_VENV")
        .map(PathBuf::from)
        .unwrap_or_else(|| workspace_root().join(".venv"))
}

/// A program from the venv, e.g. `venv_bin("python")` or `venv_bin("sushy-emulator")`.
pub fn venv_bin(name: &str) -> PathBuf {
    let path = venv().join("bin").join(name);
    assert!(
        path.exists(),
        "{} is missing: run scripts/setup first",
        path.display()
    );
    path
}

/// A TCP port on 127.0.0.1 that was free a moment ago.
pub fn free_port() -> u16 {
    let listener = TcpListener::bind("127.0.0.1:0").expect("binding an ephemeral loopback port");
    listener
        .local_addr()
        .expect("a bound listener has an address")
        .port()
}

/// Whether any socket of this network namespace listens on TCP `port` (IPv4 or IPv6), read from
/// /proc/net/tcp{,6} (proc(5)). Unlike a connect(2) probe it leaves nothing behind in the
/// listener's queue, and it works while the listening process is stopped.
pub fn tcp_listening(port: u16) -> bool {
    const LISTEN: &str = "0A";
    ["/proc/net/tcp", "/proc/net/tcp6"].iter().any(|table| {
        let text =
            std::fs::read_to_string(table).unwrap_or_else(|e| panic!("reading {table}: {e}"));
        text.lines().skip(1).any(|line| {
            let fields: Vec<&str> = line.split_whitespace().collect();
            let local_port = fields
                .get(1)
                .and_then(|local| local.rsplit_once(':'))
                .and_then(|(_, hex)| u16::from_str_radix(hex, 16).ok());
            local_port == Some(port) && fields.get(3) == Some(&LISTEN)
        })
    })
}
