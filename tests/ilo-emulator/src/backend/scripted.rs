//! A machine that a test drives by hand: the one test double for the [`Backend`] contract.
//!
//! It records every call the state machine makes (with its arguments), numbers its runs as the
//! QEMU backend does (each power-on or reset is a new run), delivers the machine events the test
//! sends, and can be told that its guest powered itself off without any event being sent, which
//! only the read-time check ([`Backend::stopped_by_itself`]) can then report.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Mutex;

use tokio::sync::mpsc;

use super::{Backend, BackendFuture, MachineEvent, MachineEventKind, MachineEvents};
use crate::state::{BootDevice, BootMode, VmDevice};

/// See the module documentation.
pub struct ScriptedMachine {
    firmware: Option<BootMode>,
    /// The number of the latest run; runs are never renumbered, so a stale event stays stale.
    run: AtomicU64,
    running: AtomicBool,
    guest_powered_off: AtomicBool,
    calls: Mutex<Vec<String>>,
    events: mpsc::UnboundedSender<MachineEvent>,
    events_rx: Mutex<Option<MachineEvents>>,
}

impl Default for ScriptedMachine {
    fn default() -> Self {
        Self::with_firmware(None)
    }
}

impl ScriptedMachine {
    /// A machine whose firmware reports `firmware` as its boot mode (`None`: it has no opinion).
    pub fn with_firmware(firmware: Option<BootMode>) -> Self {
        let (events, rx) = mpsc::unbounded_channel();
        Self {
            firmware,
            run: AtomicU64::new(0),
            running: AtomicBool::new(false),
            guest_powered_off: AtomicBool::new(false),
            calls: Mutex::new(Vec::new()),
            events,
            events_rx: Mutex::new(Some(rx)),
        }
    }

    /// The calls made so far, oldest first, as `"power_on"`, `"attach Cdrom <url>"`, ...
    pub fn calls(&self) -> Vec<String> {
        self.calls.lock().map(|c| c.clone()).unwrap_or_default()
    }

    /// The calls made since the last `take_calls`, which forgets them.
    pub fn take_calls(&self) -> Vec<String> {
        self.calls
            .lock()
            .map(|mut c| std::mem::take(&mut *c))
            .unwrap_or_default()
    }

    /// The number of the latest run (0 before the first power-on).
    pub fn run(&self) -> u64 {
        self.run.load(Ordering::SeqCst)
    }

    /// Sends a machine event of run `generation`, as the machine itself would.
    pub fn send_event(&self, kind: MachineEventKind, generation: u64) {
        // The receiver lives as long as the emulator that took it; after that nobody listens.
        let _ = self.events.send(MachineEvent {
            kind,
            generation,
            reason: "test".into(),
        });
    }

    /// The guest powers the machine off, and no event is ever sent for it.
    pub fn guest_powers_off(&self) {
        self.guest_powered_off.store(true, Ordering::SeqCst);
    }

    fn record(&self, call: String) -> BackendFuture<'_> {
        if let Ok(mut calls) = self.calls.lock() {
            calls.push(call);
        }
        Box::pin(std::future::ready(Ok(())))
    }

    fn start_run(&self, call: &str) -> BackendFuture<'_> {
        self.run.fetch_add(1, Ordering::SeqCst);
        self.running.store(true, Ordering::SeqCst);
        self.guest_powered_off.store(false, Ordering::SeqCst);
        self.record(call.to_owned())
    }
}

impl Backend for ScriptedMachine {
    fn power_on(&self) -> BackendFuture<'_> {
        self.start_run("power_on")
    }
    fn power_off(&self) -> BackendFuture<'_> {
        self.running.store(false, Ordering::SeqCst);
        self.record("power_off".into())
    }
    fn reset(&self) -> BackendFuture<'_> {
        self.start_run("reset")
    }
    fn set_boot_device(&self, device: Option<BootDevice>) -> BackendFuture<'_> {
        self.record(format!("boot_device {device:?}"))
    }
    fn attach_media<'a>(&'a self, device: VmDevice, url: &'a str) -> BackendFuture<'a> {
        self.record(format!("attach {device:?} {url}"))
    }
    fn detach_media(&self, device: VmDevice) -> BackendFuture<'_> {
        self.record(format!("detach {device:?}"))
    }
    fn firmware_boot_mode(&self) -> BackendFuture<'_, Option<BootMode>> {
        Box::pin(std::future::ready(Ok(self.firmware)))
    }
    fn set_firmware_boot_mode(&self, mode: BootMode) -> BackendFuture<'_> {
        self.record(format!("firmware {mode:?}"))
    }
    fn take_events(&self) -> Option<MachineEvents> {
        self.events_rx.lock().ok()?.take()
    }
    fn stopped_by_itself(&self) -> Option<MachineEvent> {
        let stopped =
            self.running.load(Ordering::SeqCst) && self.guest_powered_off.load(Ordering::SeqCst);
        stopped.then(|| MachineEvent {
            kind: MachineEventKind::PoweredOff,
            generation: self.run(),
            reason: "guest-shutdown".into(),
        })
    }
    fn is_current(&self, generation: u64) -> bool {
        self.running.load(Ordering::SeqCst) && self.run() == generation
    }
    fn is_running(&self) -> bool {
        self.running.load(Ordering::SeqCst)
    }
}
