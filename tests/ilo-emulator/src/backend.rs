//! The machine behind an emulated iLO.
//!
//! # Design
//! The emulator's state machine ([`crate::state`]) decides *what* happens (which device boots,
//! which media are connected, which boot mode applies); a [`Backend`] makes it happen on a
//! machine. [`InMemoryBackend`] has no machine: the state is the whole truth, which is what fast
//! tests and the 1000-node scale test need. The QEMU backend ([`crate::qemu::QemuBackend`]) maps
//! the same calls to a QEMU machine: power to the process, boot device to the boot order, media to
//! medium changes over QMP, firmware boot mode to SeaBIOS vs OVMF (docs/architecture.md §9).
//!
//! Methods return boxed futures so servers can hold `Arc<dyn Backend>` (async fn in traits is not
//! dyn-compatible).
//!
//! A machine can also change by itself (a guest powers off or reboots): a backend that can tell
//! hands out a [`MachineEvents`] receiver once ([`Backend::take_events`]); the emulator feeds
//! those events into the server's state machine ([`crate::server::Server::machine_event`]). A
//! read of the state does not wait for that: it asks the backend first
//! ([`Backend::stopped_by_itself`]), so a guest power-off reads Off at once.

use std::future::Future;
use std::path::PathBuf;
use std::pin::Pin;

use crate::state::{BootDevice, BootMode, VmDevice};

pub mod scripted;
pub use scripted::ScriptedMachine;

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

/// What the machine did by itself.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MachineEventKind {
    /// The guest powered off (or the machine stopped): the server is off now.
    PoweredOff,
    /// The guest rebooted: the server runs a new boot.
    GuestReset,
}

/// An event of one machine run; `generation` tells runs apart, so an event of a run that has
/// since been replaced (the iLO powered the server off and on again meanwhile) is dropped.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MachineEvent {
    /// What happened.
    pub kind: MachineEventKind,
    /// The run it happened in ([`Backend::is_current`]).
    pub generation: u64,
    /// Why, in words (for logs).
    pub reason: String,
}

/// The receiving end of a backend's machine events.
pub type MachineEvents = tokio::sync::mpsc::UnboundedReceiver<MachineEvent>;

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

    /// Whether the next boot enforces UEFI Secure Boot. Backends without firmware (in memory)
    /// keep only the state's flag.
    fn set_secure_boot(&self, _enforced: bool) -> BackendFuture<'_> {
        Box::pin(std::future::ready(Ok(())))
    }

    /// A `BOOT_ONCE` medium was used by the boot that just started: it must not be connected at
    /// the next boot. By default it is disconnected at once; a real machine keeps reading it
    /// until the next reset (the QEMU backend does that).
    fn release_after_boot(&self, device: VmDevice) -> BackendFuture<'_> {
        self.detach_media(device)
    }

    /// The machine's own events (guest power-off, guest reboot); `Some` once, for backends that
    /// have them.
    fn take_events(&self) -> Option<MachineEvents> {
        None
    }

    /// Asks the machine now whether its live run stopped by itself (the guest powered off, the
    /// process exited), so that a read of the power state right after a guest power-off says Off
    /// without waiting for the event's turn in [`Backend::take_events`]'s queue. The same event
    /// also arrives there later; the server handles it once (the run is no longer current
    /// then). Cheap and non-blocking: it is asked on every state read.
    fn stopped_by_itself(&self) -> Option<MachineEvent> {
        None
    }

    /// Whether `generation` is the machine run that is live now (see [`MachineEvent`]).
    fn is_current(&self, _generation: u64) -> bool {
        true
    }

    /// Whether the machine runs now (a backend without a machine says yes: the state is the
    /// truth).
    fn is_running(&self) -> bool {
        true
    }

    /// What the admin API shows about the machine (`"machine"` in `GET /_emulator/state`).
    fn describe(&self) -> BackendFuture<'_, serde_json::Value> {
        ready(serde_json::json!({ "kind": "memory" }))
    }

    /// The machine's serial console log, if it has one (`GET /_emulator/console`).
    fn console_log(&self) -> Option<PathBuf> {
        None
    }
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
