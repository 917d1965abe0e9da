//! Running the system tools an image is built with (dpkg-deb, depmod, mkfs, mtools,
//! grub-mkimage, qemu-img): a missing program fails with how to install it, a failing one with
//! what it printed.

use std::process::Command;

use anyhow::{bail, Context as _};

/// Runs `cmd`; a missing program fails with `fix` as the hint, a failure with its stderr and
/// stdout.
pub fn run(cmd: &mut Command, fix: &str) -> anyhow::Result<()> {
    output(cmd, fix).map(drop)
}

/// Runs `cmd` as [`run`] does and returns what it printed on stdout.
pub fn output(cmd: &mut Command, fix: &str) -> anyhow::Result<Vec<u8>> {
    let name = cmd.get_program().to_string_lossy().into_owned();
    let out = match cmd.output() {
        Ok(out) => out,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            bail!("{name} is not installed (fix: {fix})")
        }
        Err(e) => return Err(e).with_context(|| format!("starting {name}")),
    };
    if !out.status.success() {
        bail!(
            "{name} failed ({}): {}{}",
            out.status,
            String::from_utf8_lossy(&out.stderr).trim(),
            String::from_utf8_lossy(&out.stdout).trim()
        );
    }
    Ok(out.stdout)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_missing_tool_says_what_to_do_and_a_failing_one_what_it_printed() {
        let err = run(
            &mut Command::new("vmdeploy-no-such-tool"),
            "apt-get install x",
        )
        .expect_err("missing tool");
        assert_eq!(
            format!("{err:#}"),
            "vmdeploy-no-such-tool is not installed (fix: apt-get install x)"
        );
        let err = run(
            Command::new("sh").args(["-c", "echo broken >&2; exit 3"]),
            "apt-get install dash",
        )
        .expect_err("exit 3");
        let text = format!("{err:#}");
        assert!(
            text.starts_with("sh failed (exit status: 3): broken"),
            "{text}"
        );
    }
}
