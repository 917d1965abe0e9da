//! The machine behind an emulated iLO.
//!
//! # Design
//! The emulator's state machine ([`crate::state`]) decides *what* happens (which device boots,
//! which media are connected, which boot mode applies); a [`Backend`] makes it happen on a
//! machine. [`InMemoryBackend`] has no machine: the state is the whole truth, which is what fast
//! tests and the 1000-node scale test need. A QEMU backend (end-to-end issue) maps the same calls
//! to QMP: power to the process, boot device to the boot order, media to medium changes,
//! firmware boot mode to SeaBIOS vs OVMF (DESIGN §9).
//!
//! Methods return boxed futures so servers can hold `Arc<dyn Backend>` (async fn in traits is not
//! dyn-compatible).

use std::future::Future;
use std::pin::Pin;

use crate::state::{BootDevice, BootMode, VmDevice};

/// A failure of the machine behind the iLO; reported to the client as an iLO error.
#[derive(Debug, thiserror::Error)]
#[error("backend failed while {action}: {reason}")]
pub struct BackendError {
    /// What the backend was doing.
    pub action: &'static str,
    /// Why it failed.
    pub reason: String,
}

/// The future every backend call returns.
pub type BackendFuture<'a, T = ()> =
    Pin<Box<dyn Future<Output = Result<T, BackendError>> + Send + 'a>>;

/// Operations an emulated iLO performs on its server.
pub trait Backend: Send + Sync + 'static {
    /// Powers the server on (it boots with what was set before).
    fn power_on(&self) -> BackendFuture<'_>;
    /// Powers the server off (hard).
    fn power_off(&self) -> BackendFuture<'_>;
    /// Warm reset of a running server.
    fn reset(&self) -> BackendFuture<'_>;
    /// The device the next boot uses.
    fn set_boot_device(&self, device: Option<BootDevice>) -> BackendFuture<'_>;
    /// Connects a medium, read from `url` by HTTP range reads.
    fn attach_media<'a>(&'a self, device: VmDevice, url: &'a str) -> BackendFuture<'a>;
    /// Disconnects a medium.
    fn detach_media(&self, device: VmDevice) -> BackendFuture<'_>;
    /// The firmware's boot mode (e.g. which firmware the VM runs).
    fn firmware_boot_mode(&self) -> BackendFuture<'_, Option<BootMode>>;
    /// Selects the firmware boot mode for the next boot.
    fn set_firmware_boot_mode(&self, mode: BootMode) -> BackendFuture<'_>;
}

/// No machine: every call succeeds; the emulator's state is the truth.
#[derive(Debug, Default, Clone, Copy)]
pub struct InMemoryBackend;

fn ready<'a, T: Send + 'a>(value: T) -> BackendFuture<'a, T> {
    Box::pin(std::future::ready(Ok(value)))
}

impl Backend for InMemoryBackend {
    fn power_on(&self) -> BackendFuture<'_> {
        ready(())
    }
    fn power_off(&self) -> BackendFuture<'_> {
        ready(())
    }
    fn reset(&self) -> BackendFuture<'_> {
        ready(())
    }
    fn set_boot_device(&self, _device: Option<BootDevice>) -> BackendFuture<'_> {
        ready(())
    }
    fn attach_media<'a>(&'a self, _device: VmDevice, _url: &'a str) -> BackendFuture<'a> {
        ready(())
    }
    fn detach_media(&self, _device: VmDevice) -> BackendFuture<'_> {
        ready(())
    }
    fn firmware_boot_mode(&self) -> BackendFuture<'_, Option<BootMode>> {
        ready(None)
    }
    fn set_firmware_boot_mode(&self, _mode: BootMode) -> BackendFuture<'_> {
        ready(())
    }
}
