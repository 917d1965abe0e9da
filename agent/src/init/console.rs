//! The serial console as PID 1's stdin/stdout/stderr.
//!
//! The kernel opens `/dev/console` for /init only if the node exists when it starts /init (Debian's
//! built-in default initramfs provides it, docs/qemu-and-boot.md §4); after devtmpfs is mounted the agent opens
//! it again and puts it on fds 0–2, so logs, panics and `eprintln!` reach the console in any case.

use std::os::fd::AsRawFd;
use std::os::unix::fs::OpenOptionsExt;
use std::path::Path;

use anyhow::Context as _;

/// Points fds 0, 1 and 2 at `dev_dir/console` and switches log timestamps to uptime.
pub fn attach(dev_dir: &Path) -> anyhow::Result<()> {
    let path = dev_dir.join("console");
    let console = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .custom_flags(libc::O_NOCTTY)
        .open(&path)
        .with_context(|| format!("opening {}", path.display()))?;
    for fd in 0..=2 {
        // SAFETY: dup2 onto the standard descriptors; `console` stays open for the call, and
        // replacing 0–2 is exactly the intent (no Rust object owns them exclusively).
        if unsafe { libc::dup2(console.as_raw_fd(), fd) } < 0 {
            return Err(std::io::Error::last_os_error())
                .with_context(|| format!("dup2 of the console onto fd {fd}"));
        }
    }
    crate::logging::use_uptime_clock();
    Ok(())
}
