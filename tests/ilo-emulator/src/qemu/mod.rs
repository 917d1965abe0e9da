//! The QEMU backend: each emulated server is a real QEMU (TCG) virtual machine
//! (`ilo-emulator --backend qemu`, docs/architecture.md §9).
//!
//! - [`qmp`]: the QMP client (framing, answers by id, events, timeouts);
//! - [`machine`]: the command line and the QMP arguments for media, as pure functions;
//! - [`spawn`]: starting QEMU so it never outlives the emulator;
//! - [`backend`]: [`QemuBackend`], the [`crate::Backend`] that drives them.

pub mod backend;
pub mod machine;
pub mod qmp;
pub mod spawn;

pub use backend::{QemuBackend, QemuSettings, DEFAULT_AGENT_PORTS};
pub use machine::{
    DiskController, GuestForward, NicModel, PxeBootfile, TapName, VmediaBus, GUEST_SERVICE_ADDR,
    NIC_MAC,
};
