//! One emulated server: its state, its fault queue, its backend, and the operations both
//! protocols (RIBCL and Redfish) perform on it.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Instant;

use serde::Serialize;
use vmdeploy_shared::redact::Url;

use crate::backend::{Backend, BackendError, MachineEvent, MachineEventKind, MachineEvents};
use crate::config::ServerConfig;
use crate::fault::{FaultQueue, FaultSpec};
use crate::media_fetch::{MediaFetchError, MediaFetcher};
use crate::state::{
    BootDevice, BootMode, BootPlan, License, OneTimeBoot, Power, ServerState, StateError,
    VmBootAction, VmDevice,
};
use vmdeploy_shared::error::Chain;

/// Redfish sessions kept per server.
const MAX_SESSIONS: usize = 64;

/// Why an operation failed.
#[derive(Debug, thiserror::Error)]
pub enum OpError {
    /// Refused by the state machine.
    #[error(transparent)]
    State(#[from] StateError),
    /// The machine behind the iLO failed.
    #[error(transparent)]
    Backend(#[from] BackendError),
    /// The image URL could not be read.
    #[error(transparent)]
    Fetch(#[from] MediaFetchError),
    /// iLO Standard: no virtual media.
    #[error("virtual media requires an iLO Advanced licence")]
    LicenseRequired,
}

/// Result of a power request that may be a no-op.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PowerChange {
    /// The state changed.
    Changed,
    /// It was already in that state.
    AlreadyThere,
}

/// A snapshot of a server for `GET /_emulator/state` and the library API.
#[derive(Debug, Clone, Serialize)]
pub struct ServerSnapshot {
    /// Index in the emulator.
    pub index: usize,
    /// Listen address.
    pub address: SocketAddr,
    /// Product name.
    pub product: String,
    /// Host UUID.
    pub uuid: String,
    /// State.
    #[serde(flatten)]
    pub state: ServerState,
    /// Requests served (admin requests excluded).
    pub requests: u64,
    /// Redfish sessions open now.
    pub sessions_live: usize,
    /// Redfish sessions opened since the start.
    pub sessions_opened: u64,
    /// Faults still queued.
    pub faults_pending: Vec<FaultSpec>,
    /// What the backend says about the machine ([`Backend::describe`]).
    pub machine: serde_json::Value,
}

/// Requests being answered at once across every server of one emulator, and the most seen: a
/// conductor that promises to talk to at most N BMCs at a time is checked against it.
#[derive(Debug, Default)]
pub struct RequestGauge {
    now: AtomicUsize,
    most: AtomicUsize,
}

impl RequestGauge {
    /// Counts a request until the returned guard drops.
    pub fn enter(self: &Arc<Self>) -> InFlight {
        let now = self.now.fetch_add(1, Ordering::SeqCst) + 1;
        self.most.fetch_max(now, Ordering::SeqCst);
        InFlight(Arc::clone(self))
    }

    /// The most requests answered at once since the start or the last [`RequestGauge::reset`].
    pub fn most(&self) -> usize {
        self.most.load(Ordering::SeqCst)
    }

    /// Starts counting the most from the requests in flight now.
    pub fn reset(&self) {
        self.most
            .store(self.now.load(Ordering::SeqCst), Ordering::SeqCst);
    }
}

/// One request being answered (see [`RequestGauge`]).
pub struct InFlight(Arc<RequestGauge>);

impl Drop for InFlight {
    fn drop(&mut self) {
        self.0.now.fetch_sub(1, Ordering::SeqCst);
    }
}

/// When the host's power last changed and its POST last began: the profile's timings
/// ([`crate::profile::Timings`]) count from these.
#[derive(Debug, Default, Clone, Copy)]
struct HostClock {
    power_changed: Option<Instant>,
    post_started: Option<Instant>,
}

/// One emulated server.
pub struct Server {
    /// Index in the emulator.
    pub index: usize,
    /// Listen address.
    pub address: SocketAddr,
    /// Settings.
    pub config: Arc<ServerConfig>,
    /// Host UUID (GET /xmldata, Redfish UUID).
    pub uuid: String,
    /// Serial number.
    pub serial: String,
    state: tokio::sync::Mutex<ServerState>,
    faults: Mutex<FaultQueue>,
    backend: Arc<dyn Backend>,
    fetcher: MediaFetcher,
    requests: AtomicU64,
    sessions: Mutex<Vec<String>>,
    sessions_opened: AtomicU64,
    host_clock: Mutex<HostClock>,
    iml: Mutex<crate::iml::Iml>,
    /// Shared by every server of the emulator.
    pub gauge: Arc<RequestGauge>,
}

impl Server {
    /// A fresh server.
    pub fn new(
        index: usize,
        address: SocketAddr,
        config: Arc<ServerConfig>,
        backend: Arc<dyn Backend>,
        fetcher: MediaFetcher,
        gauge: Arc<RequestGauge>,
    ) -> Self {
        let state = ServerState::new(
            config.license,
            config.boot_mode,
            config.supported_boot_modes,
        );
        Server {
            index,
            address,
            uuid: format!("30343536-3138-584d-5132-{:012X}", index as u64 + 1),
            serial: format!("MXQ2{:06}", index + 1),
            config,
            state: tokio::sync::Mutex::new(state),
            faults: Mutex::new(FaultQueue::default()),
            backend,
            fetcher,
            requests: AtomicU64::new(0),
            sessions: Mutex::new(Vec::new()),
            sessions_opened: AtomicU64::new(0),
            host_clock: Mutex::new(HostClock::default()),
            iml: Mutex::new(crate::iml::Iml::default()),
            gauge,
        }
    }

    /// Takes the firmware boot mode from the backend when it has one (a VM whose firmware is
    /// already chosen), so current and pending start out as the machine really is.
    pub async fn sync_from_backend(&self) -> Result<(), OpError> {
        if let Some(mode) = self.backend.firmware_boot_mode().await? {
            let mut state = self.state.lock().await;
            state.boot_mode_current = mode;
            state.boot_mode_pending = mode;
        }
        Ok(())
    }

    /// Counts a request and takes the fault that applies to it.
    pub fn begin_request(&self) -> Option<FaultSpec> {
        self.requests.fetch_add(1, Ordering::Relaxed);
        self.faults.lock().ok()?.take_next()
    }

    /// Queues a fault.
    pub fn inject_fault(&self, spec: FaultSpec) {
        tracing::info!(server = self.index, ?spec, "fault queued");
        if let Ok(mut q) = self.faults.lock() {
            q.push(spec);
        }
    }

    /// Drops queued faults.
    pub fn clear_faults(&self) {
        if let Ok(mut q) = self.faults.lock() {
            q.clear();
        }
    }

    /// Whether the credentials are the configured ones.
    pub fn credentials_ok(&self, user: &str, password: &str) -> bool {
        user == self.config.username && password == self.config.password
    }

    /// A copy of the state.
    pub async fn snapshot(&self) -> ServerSnapshot {
        self.observe_machine().await;
        let state = self.state.lock().await.clone();
        let machine = match self.backend.describe().await {
            Ok(v) => v,
            Err(e) => serde_json::json!({ "error": e.to_string() }),
        };
        ServerSnapshot {
            machine,
            index: self.index,
            address: self.address,
            product: self.config.product.clone(),
            uuid: self.uuid.clone(),
            state,
            requests: self.requests.load(Ordering::Relaxed),
            sessions_live: self.session_counts().0,
            sessions_opened: self.session_counts().1,
            faults_pending: self.faults.lock().map(|q| q.pending()).unwrap_or_default(),
        }
    }

    /// Reads state under the lock, after catching up with the machine
    /// ([`Server::observe_machine`]).
    pub async fn read<T>(&self, f: impl FnOnce(&ServerState) -> T) -> T {
        self.observe_machine().await;
        f(&*self.state.lock().await)
    }

    /// Applies a stop of the machine that its event has not brought yet
    /// ([`Backend::stopped_by_itself`]): a client that reads the power state right after the
    /// guest powered off reads Off, as from a real iLO, which sees the server's power directly.
    /// (Ironic polls the power state after asking its agent to power off and forces the power
    /// off when it still reads On.)
    pub async fn observe_machine(&self) {
        if let Some(event) = self.backend.stopped_by_itself() {
            self.machine_event(event).await;
        }
    }

    /// Changes state that needs no backend call (one-time boot, persistent order, write protect).
    pub async fn update<T>(&self, f: impl FnOnce(&mut ServerState) -> T) -> T {
        let mut state = self.state.lock().await;
        let out = f(&mut state);
        tracing::info!(server = self.index, state = ?*state, "state changed");
        out
    }

    async fn run_boot(
        &self,
        state: &mut ServerState,
        plan: &BootPlan,
        reset: bool,
    ) -> Result<(), OpError> {
        // The firmware reads the boot medium by range, as at insert time: a URL that stopped
        // answering (an expired temp URL, a stopped image server) makes this boot fail to find
        // its medium. Recorded in `last_boot.media_read_error`.
        // With a boot read model (`--boot-read-mib`), this boot also reads the image's first
        // MiB by range before it counts as done: a deploy's time then includes the medium's
        // read, and the image server its load.
        if let Some(url) = state.last_boot.as_ref().and_then(|b| b.media_url.clone()) {
            let result = self
                .fetcher
                .read_for_boot(&url, &self.config.boot_read)
                .await;
            let (error, stats) = match result {
                Ok(stats) => (None, Some(stats)),
                Err(e) => (Some(e.to_string()), None),
            };
            if let Some(e) = &error {
                tracing::warn!(server = self.index, url = %Url(&url), error = %Url(e), "boot medium unreadable");
            }
            if stats.is_some() {
                state.last_media_read = stats;
            }
            if let Some(record) = state.last_boot.as_mut() {
                record.media_read_error = error;
                record.media_read = stats;
            }
        }
        self.backend.set_firmware_boot_mode(plan.mode).await?;
        self.backend.set_secure_boot(plan.secure_boot).await?;
        for (device, url) in &plan.media {
            self.backend.attach_media(*device, url).await?;
        }
        self.backend.set_boot_device(plan.device).await?;
        if reset {
            self.backend.reset().await?;
        } else {
            self.backend.power_on().await?;
        }
        for device in &plan.detach_after_boot {
            self.backend.release_after_boot(*device).await?;
        }
        tracing::info!(server = self.index, ?plan, reset, "server booted");
        Ok(())
    }

    /// The backend's machine events, once (the emulator forwards them to
    /// [`Server::machine_event`]).
    pub fn take_machine_events(&self) -> Option<MachineEvents> {
        self.backend.take_events()
    }

    /// The machine's serial console log, if the backend has one.
    pub fn console_log(&self) -> Option<std::path::PathBuf> {
        self.backend.console_log()
    }

    /// Reads the console written since the last call and records the firmware's refusals in
    /// the IML ([`crate::iml`]); the emulator calls it every second, and an IML read calls it
    /// first. A machine without a console log has nothing to scan.
    pub fn scan_console(&self) {
        use std::io::{Read as _, Seek as _};
        let Some(path) = self.console_log() else {
            return;
        };
        let mut iml = self.iml.lock().unwrap_or_else(|e| e.into_inner());
        let Ok(mut file) = std::fs::File::open(&path) else {
            return;
        };
        // A console log that shrank was replaced: read it from its start.
        let len = file.metadata().map(|m| m.len()).unwrap_or(0);
        if len < iml.scanned {
            iml.scanned = 0;
        }
        let mut text = Vec::new();
        if file.seek(std::io::SeekFrom::Start(iml.scanned)).is_err()
            || file.read_to_end(&mut text).is_err()
        {
            return;
        }
        let now = crate::iml::rfc3339(std::time::SystemTime::now());
        let recorded = iml.scan(&text, &now);
        if recorded > 0 {
            tracing::info!(
                server = self.index,
                recorded,
                "IML: the firmware refused a boot image"
            );
        }
    }

    /// Records an IML entry now; returns its id.
    pub fn record_iml(&self, severity: &'static str, message: String) -> u64 {
        let mut iml = self.iml.lock().unwrap_or_else(|e| e.into_inner());
        iml.record(
            severity,
            message,
            crate::iml::rfc3339(std::time::SystemTime::now()),
        );
        iml.entries().last().map_or(0, |e| e.id)
    }

    /// The IML's entries, oldest first, after a scan of the console.
    pub fn iml_entries(&self) -> Vec<crate::iml::ImlEntry> {
        self.scan_console();
        self.iml
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .entries()
            .to_vec()
    }

    /// The machine changed by itself: a guest power-off makes the server Off, as a real server's
    /// iLO reports it; a guest reboot is a boot like a reset (one-time boot consumed, pending
    /// boot mode applied). Events of a run that has been replaced since are ignored.
    pub async fn machine_event(&self, event: MachineEvent) {
        let mut state = self.state.lock().await;
        if !self.backend.is_current(event.generation) {
            tracing::debug!(server = self.index, ?event, "stale machine event ignored");
            return;
        }
        match event.kind {
            MachineEventKind::PoweredOff => {
                if state.power_off() {
                    tracing::info!(server = self.index, reason = %event.reason, "the machine powered off by itself");
                }
                if let Err(e) = self.backend.power_off().await {
                    tracing::warn!(server = self.index, error = %Chain(&e), "cleaning up after the machine's power-off");
                }
            }
            MachineEventKind::GuestReset => {
                tracing::info!(server = self.index, reason = %event.reason, "the guest rebooted");
                let result = match state.reset() {
                    Ok(plan) => self.run_boot(&mut state, &plan, true).await,
                    Err(e) => Err(e.into()),
                };
                if let Err(e) = result {
                    tracing::warn!(server = self.index, error = %Chain(&e), "the boot after the guest's reboot failed; the server is off");
                    state.power_off();
                    let _ = self.backend.power_off().await;
                }
            }
        }
    }

    fn mark_power_change(&self, post_begins: bool) {
        if let Ok(mut clock) = self.host_clock.lock() {
            let now = Instant::now();
            clock.power_changed = Some(now);
            if post_begins {
                clock.post_started = Some(now);
            }
        }
    }

    fn clock(&self) -> HostClock {
        self.host_clock.lock().map(|c| *c).unwrap_or_default()
    }

    /// Whether the host, on, is still in POST: within the profile's POST time of its last
    /// power-on or reset.
    pub async fn in_post(&self) -> bool {
        self.post_state().await == "InPost"
    }

    /// `Oem.Hpe.PostState`: `PowerOff`, `InPost` or `FinishedPost` (one read of the state).
    pub async fn post_state(&self) -> &'static str {
        if self.read(|s| s.power == Power::Off).await {
            "PowerOff"
        } else if self
            .clock()
            .post_started
            .is_some_and(|t| t.elapsed() < self.config.profile.timings.post)
        {
            "InPost"
        } else {
            "FinishedPost"
        }
    }

    /// Whether the last power change is more recent than the profile's reset window.
    pub fn in_reset_window(&self) -> bool {
        self.clock()
            .power_changed
            .is_some_and(|t| t.elapsed() < self.config.profile.timings.reset_window)
    }

    /// Whether the profile has `quirk` on.
    pub fn quirk(&self, quirk: crate::profile::Quirk) -> bool {
        self.config.profile.has(quirk)
    }

    /// Power on (no-op when on).
    pub async fn power_on(&self) -> Result<PowerChange, OpError> {
        let mut state = self.state.lock().await;
        match state.power_on() {
            None => Ok(PowerChange::AlreadyThere),
            Some(plan) => {
                tracing::info!(server = self.index, "power on");
                if let Err(e) = self.run_boot(&mut state, &plan, false).await {
                    // The machine did not start: the server stays off, as it really is.
                    state.power_off();
                    return Err(e);
                }
                self.mark_power_change(true);
                Ok(PowerChange::Changed)
            }
        }
    }

    /// Power off, hard (no-op when off).
    pub async fn power_off(&self) -> Result<PowerChange, OpError> {
        let mut state = self.state.lock().await;
        if !state.power_off() {
            return Ok(PowerChange::AlreadyThere);
        }
        tracing::info!(server = self.index, "power off");
        self.mark_power_change(false);
        self.backend.power_off().await?;
        Ok(PowerChange::Changed)
    }

    /// Warm reset; fails when off.
    pub async fn reset(&self) -> Result<(), OpError> {
        let mut state = self.state.lock().await;
        let plan = state.reset()?;
        tracing::info!(server = self.index, "reset");
        let result = self.run_boot(&mut state, &plan, true).await;
        self.mark_power_change(true);
        if result.is_err() && !self.backend.is_running() {
            // The machine did not come back: the server is off now.
            state.power_off();
        }
        result
    }

    /// Carries out a Redfish or RIS `ResetType` (GracefulRestart restarts by force, as HPE
    /// documents); `None` for a type the emulator does not know.
    pub async fn reset_by_type(&self, reset_type: &str) -> Option<Result<(), OpError>> {
        Some(match reset_type {
            "On" | "ForceOn" => self.power_on().await.map(|_| ()),
            "ForceOff" | "GracefulShutdown" => self.power_off().await.map(|_| ()),
            "ForceRestart" | "GracefulRestart" => self.reset().await,
            "PowerCycle" => match self.power_off().await {
                Ok(_) => self.power_on().await.map(|_| ()),
                Err(e) => Err(e),
            },
            "PushPowerButton" => self.press_power_button().await,
            // An NMI to a running host changes nothing the emulator models.
            "Nmi" => Ok(()),
            _ => return None,
        })
    }

    /// Momentary press of the power button: toggles power. A real OS would shut down
    /// gracefully; with no OS to ask, the emulator powers off at once.
    pub async fn press_power_button(&self) -> Result<(), OpError> {
        let on = self.state.lock().await.power == Power::On;
        if on {
            self.power_off().await?;
        } else {
            self.power_on().await?;
        }
        Ok(())
    }

    /// Sets the pending boot mode.
    pub async fn set_pending_boot_mode(&self, mode: BootMode) -> Result<(), OpError> {
        self.update(|s| s.set_pending_boot_mode(mode)).await?;
        Ok(())
    }

    /// Sets or clears the one-time boot.
    pub async fn set_one_time_boot(&self, target: Option<OneTimeBoot>) {
        self.update(|s| s.one_time_boot = target).await;
    }

    /// Sets the persistent boot order.
    pub async fn set_persistent_boot(&self, devices: &[BootDevice]) {
        self.update(|s| {
            s.set_persistent_boot(devices);
            s.continuous_override = None;
        })
        .await;
    }

    fn check_license(state: &ServerState) -> Result<(), OpError> {
        if state.license.allows_virtual_media() {
            Ok(())
        } else {
            Err(OpError::LicenseRequired)
        }
    }

    /// Checks the licence for a virtual media read.
    pub async fn vmedia_allowed(&self) -> Result<(), OpError> {
        Self::check_license(&*self.state.lock().await)
    }

    /// Inserts an image: reads it by range first; fails like iLO when it cannot.
    pub async fn insert_media(&self, device: VmDevice, url: &str) -> Result<(), OpError> {
        self.vmedia_allowed().await?;
        // The probe runs without the state lock: it can take seconds.
        let size = self.fetcher.probe(url).await?;
        let mut state = self.state.lock().await;
        Self::check_license(&state)?;
        let was_connected = state.vm(device).connected;
        state.insert(device, url.to_owned(), size);
        if was_connected {
            // A new image in a connected drive: the host sees a media change.
            self.backend.detach_media(device).await?;
            self.backend.attach_media(device, url).await?;
        }
        tracing::info!(
            server = self.index,
            ?device,
            url,
            ?size,
            "virtual media inserted"
        );
        Ok(())
    }

    /// Ejects an image; fails when none is inserted.
    pub async fn eject_media(&self, device: VmDevice) -> Result<(), OpError> {
        let mut state = self.state.lock().await;
        Self::check_license(&state)?;
        let was_connected = state.vm(device).connected;
        state.eject(device)?;
        if was_connected {
            self.backend.detach_media(device).await?;
        }
        tracing::info!(server = self.index, ?device, "virtual media ejected");
        Ok(())
    }

    /// SET_VM_STATUS: boot option and/or write protect.
    pub async fn set_vm_status(
        &self,
        device: VmDevice,
        action: Option<VmBootAction>,
        write_protect: Option<bool>,
    ) -> Result<(), OpError> {
        let mut state = self.state.lock().await;
        Self::check_license(&state)?;
        if let Some(wp) = write_protect {
            state.vm_mut(device).write_protect = wp;
        }
        if let Some(action) = action {
            let was_connected = state.vm(device).connected;
            state.set_vm_boot(device, action);
            let vm = state.vm(device);
            match (was_connected, vm.connected, vm.url.clone()) {
                (false, true, Some(url)) => self.backend.attach_media(device, &url).await?,
                (true, false, _) => self.backend.detach_media(device).await?,
                _ => {}
            }
        }
        tracing::info!(server = self.index, ?device, vm = ?state.vm(device), "virtual media status set");
        Ok(())
    }

    /// Connects an inserted medium now without changing its boot option (Redfish insert).
    pub async fn connect_media(&self, device: VmDevice) -> Result<(), OpError> {
        let mut state = self.state.lock().await;
        Self::check_license(&state)?;
        let vm = state.vm_mut(device);
        let Some(url) = vm.url.clone() else {
            return Err(StateError::NoImage.into());
        };
        if !vm.connected {
            vm.connected = true;
            self.backend.attach_media(device, &url).await?;
            tracing::info!(server = self.index, ?device, url = %Url(&url), "virtual media connected");
        }
        Ok(())
    }

    /// Installs a licence key (any key makes it Advanced).
    pub async fn activate_license(&self) {
        self.update(|s| s.license = License::Advanced).await;
    }

    /// Redfish: creates a session token.
    /// Opens a Redfish session: its token, or `None` when the table is full and the profile
    /// refuses logins then ([`crate::profile::Quirk::SessionLimit`]).
    pub fn new_session(&self) -> Option<String> {
        let cap = self.config.profile.timings.session_cap;
        if self.quirk(crate::profile::Quirk::SessionLimit)
            && self.sessions.lock().map(|s| s.len()).unwrap_or(0) >= cap
        {
            return None;
        }
        let n = self.requests.load(Ordering::Relaxed);
        let token = format!(
            "{:016x}{:016x}",
            n.wrapping_mul(0x9E37_79B9_7F4A_7C15),
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map(|d| d.as_nanos() as u64)
                .unwrap_or(0)
        );
        self.sessions_opened.fetch_add(1, Ordering::Relaxed);
        if let Ok(mut s) = self.sessions.lock() {
            // Bounded like a real iLO's session table; the oldest session is dropped (a real
            // iLO refuses new logins instead [guess]; dropping keeps long scale runs working).
            if s.len() >= MAX_SESSIONS {
                s.remove(0);
            }
            s.push(token.clone());
        }
        Some(token)
    }

    /// The ids (first 16 characters of the token) of the sessions open now.
    pub fn session_ids(&self) -> Vec<String> {
        self.sessions
            .lock()
            .map(|s| s.iter().map(|t| t.chars().take(16).collect()).collect())
            .unwrap_or_default()
    }

    /// Redfish sessions open now, and opened since the start: a client that leaks sessions
    /// leaves the first above zero.
    pub fn session_counts(&self) -> (usize, u64) {
        (
            self.sessions.lock().map(|s| s.len()).unwrap_or(0),
            self.sessions_opened.load(Ordering::Relaxed),
        )
    }

    /// Redfish: whether a session token is live.
    pub fn session_ok(&self, token: &str) -> bool {
        self.sessions
            .lock()
            .map(|s| s.iter().any(|t| t == token))
            .unwrap_or(false)
    }

    /// Redfish: ends the session whose id (see [`Server::session_ids`]) is `id`, matched without case
    /// (the router lower-cases paths).
    pub fn end_session_with_id(&self, id: &str) -> bool {
        self.sessions
            .lock()
            .map(|mut s| {
                let before = s.len();
                s.retain(|t| !t.get(..16).is_some_and(|p| p.eq_ignore_ascii_case(id)));
                s.len() != before
            })
            .unwrap_or(false)
    }

    /// Redfish: ends a session; false when unknown.
    pub fn end_session(&self, token: &str) -> bool {
        self.sessions
            .lock()
            .map(|mut s| {
                let before = s.len();
                s.retain(|t| t != token);
                s.len() != before
            })
            .unwrap_or(false)
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::time::Duration;

    use crate::backend::{Backend, MachineEventKind, ScriptedMachine};
    use crate::state::Power;
    use crate::{Emulator, EmulatorConfig};

    async fn wait_for(
        server: &super::Server,
        what: &str,
        pred: impl Fn(&super::ServerState) -> bool,
    ) {
        for _ in 0..200 {
            if server.read(&pred).await {
                return;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        panic!("{what}: not within 2 s");
    }

    #[tokio::test]
    async fn machine_events_drive_the_state_and_stale_ones_are_ignored() {
        let backend = Arc::new(ScriptedMachine::default());
        let mut config = EmulatorConfig::loopback();
        let b = backend.clone();
        config.backend = Arc::new(move |_| b.clone() as Arc<dyn Backend>);
        let emulator = Emulator::start(config).await.expect("starting");
        let server = emulator.server(0).expect("server 0").clone();

        server.power_on().await.expect("power on");
        // Run 1 reboots by itself: a new boot through the state machine (run 2).
        backend.send_event(MachineEventKind::GuestReset, 1);
        wait_for(&server, "the guest reboot", |s| s.boots == 2).await;
        assert_eq!(backend.run(), 2);
        // A power-off of the replaced run 1 changes nothing.
        backend.send_event(MachineEventKind::PoweredOff, 1);
        tokio::time::sleep(Duration::from_millis(100)).await;
        assert_eq!(server.read(|s| s.power).await, Power::On);
        // The live run powers off: the server is off, as an iLO reports it.
        backend.send_event(MachineEventKind::PoweredOff, 2);
        wait_for(&server, "the guest power-off", |s| s.power == Power::Off).await;
        // Each boot (the power-on, the guest's reboot) sets the firmware and the boot device.
        let boot = ["firmware Legacy", "boot_device Some(Hdd)"];
        let expected = [&boot[..], &["power_on"], &boot, &["reset", "power_off"]].concat();
        assert_eq!(backend.calls(), expected);
        emulator.shutdown().await;
    }
}
