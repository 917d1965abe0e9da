//! Locks for what tests share beyond their own process: nextest runs every test in a process of
//! its own, and two test runs may overlap on one machine. A test that uses a fixed name (the
//! floppy label `ir-vfd-dev`, which the agent finds by scanning every block device) holds the
//! lock of that name for as long as it uses it; tgtd's start holds one while it picks a free
//! control socket number (src/tgt.rs). Ports need none: each test binds port 0 or takes a
//! free one.
//!
//! flock(2) on a file in the temp dir: the kernel drops the lock when its holder exits, so a
//! crashed test never leaves it taken.

use std::fs::File;
use std::os::fd::AsRawFd;
use std::path::PathBuf;

/// An exclusive lock on a named resource, released on drop.
pub struct ResourceLock {
    // Closing the file releases the lock.
    _file: File,
}

impl ResourceLock {
    /// Waits until no other process holds `name`, then holds it.
    pub fn acquire(name: &str) -> ResourceLock {
        assert!(
            name.bytes()
                .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_'),
            "lock name {name:?}: letters, digits, '-' and '_' only"
        );
        let path: PathBuf = std::env::temp_dir().join(format!("vmdeploy-test-{name}.lock"));
        let file = File::options()
            .create(true)
            .truncate(false)
            .write(true)
            .open(&path)
            .unwrap_or_else(|e| panic!("opening the lock file {}: {e}", path.display()));
        loop {
            // SAFETY: the descriptor is valid for as long as `file` lives.
            let rc = unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX) };
            if rc == 0 {
                break;
            }
            let err = std::io::Error::last_os_error();
            assert!(
                err.kind() == std::io::ErrorKind::Interrupted,
                "locking {}: {err}",
                path.display()
            );
        }
        ResourceLock { _file: file }
    }
}
