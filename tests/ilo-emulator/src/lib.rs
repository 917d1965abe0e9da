//! vmdeploy-ilo-emulator: emulated HP iLOs (RIBCL and Redfish over HTTPS on one port) for tests
//! and demos, many in one process, each with its own state machine and fault queue.
//!
//! In-process use:
//! ```no_run
//! # async fn demo() -> anyhow::Result<()> {
//! use vmdeploy_ilo_emulator::{Emulator, EmulatorConfig};
//! let emulator = Emulator::start(EmulatorConfig::loopback()).await?;
//! let addr = emulator.addresses()[0];
//! let state = emulator.state(0).await;
//! # let _ = (addr, state); Ok(()) }
//! ```
//! Facts behind the behaviour: docs/ilo-management.md; the README in this
//! crate lists which answers come from captures and which are guesses.

#![warn(missing_docs)]

pub mod admin;
pub mod backend;
pub mod boot_target;
pub mod config;
pub mod emulator;
pub mod fault;
pub mod http;
pub mod iml;
pub mod media_fetch;
pub mod profile;
pub mod qemu;
pub mod redfish;
pub mod ribcl;
pub mod ris;
pub mod server;
pub mod state;
pub mod tls;
pub mod xml;

pub use backend::{Backend, BackendError, InMemoryBackend};
pub use boot_target::BootTarget;
pub use config::{EmulatorConfig, ServerConfig, TlsSource, DEFAULT_PRODUCT};
pub use emulator::Emulator;
pub use fault::{FaultKind, FaultSpec};
pub use profile::{Profile, Quirk, QuirkSwitch};
pub use server::{Server, ServerSnapshot};
pub use state::{BootDevice, BootMode, License, Power, SupportedBootModes, VmDevice};
