//! Shared helpers for vmdeploy's integration tests: locating the built binaries and the Python
//! peers, free loopback ports, and starting real peers (tgtd, Swift, sushy-tools) on loopback.
//!
//! The test command (`scripts/test`) builds every binary before the tests run; a test that cannot
//! find one fails with a message that says how to build it.

pub mod sushy;
pub mod swift;
pub mod tgt;

pub mod http;
pub mod ipa_standin;
pub mod iscsi_standin;
pub mod qemu;

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
/// `CARGO_TARGET_DIR`.
pub fn bin(name: &str) -> PathBuf {
    let target = std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| workspace_root().join("target"));
    let path = target.join("debug").join(name);
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
