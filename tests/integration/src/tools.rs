//! Small things many tests need: running a system tool that must be installed, and
//! deterministic test data.

use std::process::{Command, Output};

/// Runs `program`; a missing one fails the test with the Debian package that has it.
pub fn tool(program: &str, package: &str, args: &[&str]) -> Output {
    match Command::new(program).args(args).output() {
        Ok(out) => out,
        Err(err) if err.kind() == std::io::ErrorKind::NotFound => {
            panic!("{program} is not installed: apt-get install {package} (scripts/setup does)")
        }
        Err(err) => panic!("starting {program}: {err}"),
    }
}

/// Runs a tool that must succeed; returns its stdout and stderr together.
pub fn tool_ok(program: &str, package: &str, args: &[&str]) -> String {
    let out = tool(program, package, args);
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        out.status.success(),
        "{program} {args:?} failed ({}): {text}",
        out.status
    );
    text
}

/// Runs `curl -sk --max-time 60 ARGS` (self-signed test certificates: not checked), which
/// must succeed; returns its stdout.
pub fn curl(args: &[&str]) -> String {
    let mut all = vec!["-sk", "--max-time", "60"];
    all.extend_from_slice(args);
    let out = tool("curl", "curl", &all);
    assert!(
        out.status.success(),
        "curl {args:?} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// `len` pseudo-random bytes from an xorshift64 sequence started at `seed` (an even seed is
/// made odd: xorshift never leaves 0). Deterministic, so a misplaced block cannot go unseen.
pub fn xorshift_bytes(len: usize, seed: u64) -> Vec<u8> {
    let mut x = seed | 1;
    let mut out = Vec::with_capacity(len + 8);
    while out.len() < len {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        out.extend_from_slice(&x.to_le_bytes());
    }
    out.truncate(len);
    out
}
