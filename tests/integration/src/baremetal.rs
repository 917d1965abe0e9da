//! The `baremetal` CLI (python-ironicclient from the setup's venv, unchanged), run as an
//! operator runs it against a standalone conductor: no authentication, the endpoint given, and
//! a clean environment (no cloud from the caller's clouds.yaml or `OS_*` variables, no API
//! version cached by an earlier run).

use std::path::Path;
use std::process::{Command, Output};

/// `baremetal ARGS` against the API at `endpoint`, its caches under `home`.
pub fn run(endpoint: &str, home: &Path, args: &[&str]) -> Output {
    Command::new(crate::venv_bin("baremetal"))
        .args(["--os-auth-type", "none", "--os-endpoint", endpoint])
        .args(args)
        .env_clear()
        .env("PATH", std::env::var_os("PATH").unwrap_or_default())
        .env("HOME", home)
        .output()
        .expect("running the baremetal CLI (fix: scripts/setup makes the venv)")
}

/// The standard output of `out`, a run of `baremetal ARGS` that must have succeeded; the
/// failure names the command and shows both outputs.
pub fn succeeded(args: &[&str], out: &Output) -> String {
    assert!(
        out.status.success(),
        "baremetal {}: exit {:?}\nstdout: {}\nstderr: {}",
        args.join(" "),
        out.status.code(),
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}
