//! The state machine of one emulated server: power, boot mode (current vs pending), one-time and
//! persistent boot, virtual media per device, licence.
//!
//! # Design
//! The rules come from docs/ilo-management.md §1.5 ("VM semantics"):
//! - a pending boot mode becomes current at the next boot (power-on or reset);
//! - a one-time boot is consumed by the boot that uses it;
//! - `BOOT_ONCE` media is used for the next boot, then the device goes back to `NO_BOOT`, no image,
//!   write protect off;
//! - `CONNECT` connects now and sets `BOOT_ALWAYS`; `DISCONNECT` disconnects and sets `NO_BOOT`.
//!
//! The state is plain data (a few hundred bytes per server, so 1000 servers cost little); the side
//! effects on a real machine (QEMU) go through [`crate::backend::Backend`], called by
//! [`crate::server::Server`] from the [`BootPlan`] a transition returns.

use serde::Serialize;

use crate::boot_target::BootTarget;

/// Host power as RIBCL reports it (`GET_HOST_POWER HOST_POWER="ON"`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "UPPERCASE")]
pub enum Power {
    /// Powered on.
    On,
    /// Powered off.
    Off,
}

/// Firmware boot mode.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "UPPERCASE")]
pub enum BootMode {
    /// Legacy BIOS.
    Legacy,
    /// UEFI.
    Uefi,
}

impl BootMode {
    /// The RIBCL spelling (`LEGACY`, `UEFI`).
    pub fn ribcl(self) -> &'static str {
        match self {
            BootMode::Legacy => "LEGACY",
            BootMode::Uefi => "UEFI",
        }
    }

    /// Parses the RIBCL spelling, case-insensitively.
    pub fn from_ribcl(s: &str) -> Option<Self> {
        match s.to_ascii_uppercase().as_str() {
            "LEGACY" => Some(BootMode::Legacy),
            "UEFI" => Some(BootMode::Uefi),
            _ => None,
        }
    }
}

/// Which boot modes the emulated firmware supports (`GET_SUPPORTED_BOOT_MODE`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub enum SupportedBootModes {
    /// `LEGACY_ONLY`
    LegacyOnly,
    /// `UEFI_ONLY`
    UefiOnly,
    /// `LEGACY_UEFI`
    LegacyUefi,
}

impl SupportedBootModes {
    /// The RIBCL spelling.
    pub fn ribcl(self) -> &'static str {
        match self {
            SupportedBootModes::LegacyOnly => "LEGACY_ONLY",
            SupportedBootModes::UefiOnly => "UEFI_ONLY",
            SupportedBootModes::LegacyUefi => "LEGACY_UEFI",
        }
    }

    /// Whether `mode` may be set.
    pub fn allows(self, mode: BootMode) -> bool {
        !matches!(
            (self, mode),
            (SupportedBootModes::LegacyOnly, BootMode::Uefi)
                | (SupportedBootModes::UefiOnly, BootMode::Legacy)
        )
    }
}

/// A boot device as RIBCL names it (SET_ONE_TIME_BOOT / SET_PERSISTENT_BOOT values).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub enum BootDevice {
    /// `CDROM`: in UEFI the iLO virtual CD.
    Cdrom,
    /// `FLOPPY`: in UEFI the iLO virtual USB key.
    Floppy,
    /// `HDD`: the embedded RAID logical drive.
    Hdd,
    /// `USB`
    Usb,
    /// `NETWORK`: PXE on the embedded NIC.
    Network,
    /// `RBSU`: the setup utility.
    Rbsu,
}

/// The legacy persistent boot order of a fresh server (as a DL380p Gen8 ships).
pub const DEFAULT_BOOT_ORDER: [BootDevice; 5] = [
    BootDevice::Cdrom,
    BootDevice::Floppy,
    BootDevice::Usb,
    BootDevice::Hdd,
    BootDevice::Network,
];

impl BootDevice {
    /// The RIBCL spelling.
    pub fn ribcl(self) -> &'static str {
        match self {
            BootDevice::Cdrom => "CDROM",
            BootDevice::Floppy => "FLOPPY",
            BootDevice::Hdd => "HDD",
            BootDevice::Usb => "USB",
            BootDevice::Network => "NETWORK",
            BootDevice::Rbsu => "RBSU",
        }
    }

    /// Parses a RIBCL device name, case-insensitively. UEFI `BootXXXX` ids are resolved through
    /// [`BootDevice::from_uefi_id`].
    pub fn from_ribcl(s: &str) -> Option<Self> {
        match s.trim().to_ascii_uppercase().as_str() {
            "CDROM" => Some(BootDevice::Cdrom),
            "FLOPPY" => Some(BootDevice::Floppy),
            "HDD" => Some(BootDevice::Hdd),
            "USB" => Some(BootDevice::Usb),
            "NETWORK" => Some(BootDevice::Network),
            "RBSU" => Some(BootDevice::Rbsu),
            _ => None,
        }
    }

    /// The UEFI boot options (`BootXXXX`) of this device and their descriptions, as a real iLO 4
    /// in UEFI mode lists them (proliantutils `proliantutils/tests/ilo/ribcl_sample_outputs.py`,
    /// GET_PERSISTENT_BOOT_DEVICE_*_UEFI_XML and GET_NIC_DATA): long descriptions wrapped over
    /// lines inside the attribute, a NIC entry each for IPv4 and IPv6 with a trailing space, the
    /// virtual key, and a generic USB entry. Clients map them back by substring ("HP iLO Virtual
    /// USB CD" is CDROM, "NIC"/"PXE" is NETWORK, "Logical Drive" is HDD; docs/ilo-management.md §1.5).
    /// Empty for devices that have no UEFI boot option here.
    pub fn uefi_options(self) -> &'static [(&'static str, &'static str)] {
        match self {
            BootDevice::Cdrom => &[(
                "Boot000B",
                "iLO Virtual USB 2 : HP iLO Virtual USB CD/DVD ROM",
            )],
            BootDevice::Floppy => &[("Boot000A", "iLO Virtual USB 1 : HP iLO Virtual USB Key")],
            BootDevice::Hdd => &[(
                "Boot0007",
                "Embedded RAID 1 : Smart Array P420i Controller - 279.37 GiB,\n             RAID 1 Logical Drive(Target:0, Lun:0)",
            )],
            BootDevice::Network => &[
                (
                    "Boot0009",
                    "Embedded LOM 1 Port 1 : HP Ethernet 1Gb 4-port 331i Adapter\n            - NIC (PXE IPv4) ",
                ),
                (
                    "Boot0008",
                    "Embedded LOM 1 Port 1 : HP Ethernet 1Gb 4-port 331i Adapter\n            - NIC (PXE IPv6) ",
                ),
            ],
            BootDevice::Usb => &[("Boot0000", "Generic USB Boot")],
            BootDevice::Rbsu => &[],
        }
    }

    /// Resolves a UEFI `BootXXXX` id (case-insensitive) to a device.
    pub fn from_uefi_id(id: &str) -> Option<Self> {
        DEFAULT_BOOT_ORDER.into_iter().find(|d| {
            d.uefi_options()
                .iter()
                .any(|(opt, _)| opt.eq_ignore_ascii_case(id.trim()))
        })
    }
}

/// A boot target name iLO does not know.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unknown boot target {0:?}")]
pub struct UnknownBootTarget(pub String);

/// A one-time boot target: a device, one of the embedded applications iLO 4 accepts, or a
/// Redfish target RIBCL has no name for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub enum OneTimeBoot {
    /// A boot device.
    Device(BootDevice),
    /// `EMB-MENU`, `EMB-ACU`, `EMB-HPSUM-AUTO`, `EMB-DIAGS` (iLO 4).
    Embedded(&'static str),
    /// An iLO 5 Redfish target without a RIBCL device or application of its own (`UefiHttp`,
    /// `UefiShell`, `SDCard`, `UefiTarget`).
    Redfish(BootTarget),
}

impl OneTimeBoot {
    /// The RIBCL spelling.
    pub fn ribcl(self) -> &'static str {
        match self {
            OneTimeBoot::Device(d) => d.ribcl(),
            OneTimeBoot::Embedded(e) => e,
            OneTimeBoot::Redfish(t) => t.ribcl(),
        }
    }

    /// The one-time boot a Redfish `Once` override to `target` sets; `None` for `None`.
    pub fn from_target(target: BootTarget) -> Option<OneTimeBoot> {
        Some(match target {
            BootTarget::None => return None,
            BootTarget::Utilities => OneTimeBoot::Embedded("EMB-MENU"),
            BootTarget::Diags => OneTimeBoot::Embedded("EMB-DIAGS"),
            BootTarget::UefiHttp
            | BootTarget::UefiShell
            | BootTarget::SdCard
            | BootTarget::UefiTarget => OneTimeBoot::Redfish(target),
            BootTarget::Cd
            | BootTarget::Hdd
            | BootTarget::Usb
            | BootTarget::Pxe
            | BootTarget::BiosSetup => match target.device() {
                Some(d) => OneTimeBoot::Device(d),
                None => OneTimeBoot::Redfish(target),
            },
        })
    }

    /// How Redfish reports this one-time boot. RIBCL's FLOPPY is the virtual USB key on iLO 5
    /// (`Usb`); its `EMB-*` applications other than diagnostics are System Utilities.
    pub fn target(self) -> BootTarget {
        match self {
            OneTimeBoot::Device(d) => match d {
                BootDevice::Cdrom => BootTarget::Cd,
                BootDevice::Floppy | BootDevice::Usb => BootTarget::Usb,
                BootDevice::Hdd => BootTarget::Hdd,
                BootDevice::Network => BootTarget::Pxe,
                BootDevice::Rbsu => BootTarget::BiosSetup,
            },
            OneTimeBoot::Embedded("EMB-DIAGS") => BootTarget::Diags,
            OneTimeBoot::Embedded(_) => BootTarget::Utilities,
            OneTimeBoot::Redfish(t) => t,
        }
    }

    /// Parses a SET_ONE_TIME_BOOT value. `Ok(None)` is `NORMAL` (clear).
    pub fn from_ribcl(s: &str) -> Result<Option<Self>, UnknownBootTarget> {
        let upper = s.trim().to_ascii_uppercase();
        if upper == "NORMAL" {
            return Ok(None);
        }
        if let Some(d) = BootDevice::from_ribcl(&upper).or_else(|| BootDevice::from_uefi_id(&upper))
        {
            return Ok(Some(OneTimeBoot::Device(d)));
        }
        const EMBEDDED: [&str; 4] = ["EMB-MENU", "EMB-ACU", "EMB-HPSUM-AUTO", "EMB-DIAGS"];
        EMBEDDED
            .into_iter()
            .find(|e| *e == upper)
            .map(|e| Some(OneTimeBoot::Embedded(e)))
            .ok_or_else(|| UnknownBootTarget(s.to_owned()))
    }
}

/// The two virtual media devices of an iLO.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub enum VmDevice {
    /// `FLOPPY` (also the virtual USB key).
    Floppy,
    /// `CDROM` (CD/DVD).
    Cdrom,
}

impl VmDevice {
    /// The RIBCL spelling.
    pub fn ribcl(self) -> &'static str {
        match self {
            VmDevice::Floppy => "FLOPPY",
            VmDevice::Cdrom => "CDROM",
        }
    }

    /// Parses a DEVICE attribute, case-insensitively.
    pub fn from_ribcl(s: &str) -> Option<Self> {
        match s.trim().to_ascii_uppercase().as_str() {
            "FLOPPY" => Some(VmDevice::Floppy),
            "CDROM" => Some(VmDevice::Cdrom),
            _ => None,
        }
    }

    /// Default write protection: YES for the CD, NO for the floppy (docs/ilo-management.md §1.5).
    pub fn default_write_protect(self) -> bool {
        matches!(self, VmDevice::Cdrom)
    }

    /// The boot device this medium boots as.
    pub fn boot_device(self) -> BootDevice {
        match self {
            VmDevice::Floppy => BootDevice::Floppy,
            VmDevice::Cdrom => BootDevice::Cdrom,
        }
    }

    fn index(self) -> usize {
        match self {
            VmDevice::Floppy => 0,
            VmDevice::Cdrom => 1,
        }
    }
}

/// VM_BOOT_OPTION as it is stored (CONNECT and DISCONNECT are actions, not states).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
pub enum VmBootOption {
    /// Connect at every boot.
    BootAlways,
    /// Connect at the next boot only.
    BootOnce,
    /// Do not connect at boot.
    NoBoot,
}

impl VmBootOption {
    /// The RIBCL spelling.
    pub fn ribcl(self) -> &'static str {
        match self {
            VmBootOption::BootAlways => "BOOT_ALWAYS",
            VmBootOption::BootOnce => "BOOT_ONCE",
            VmBootOption::NoBoot => "NO_BOOT",
        }
    }
}

/// A SET_VM_STATUS VM_BOOT_OPTION value.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum VmBootAction {
    /// Store an option.
    Set(VmBootOption),
    /// Connect now, BOOT_ALWAYS.
    Connect,
    /// Disconnect now, NO_BOOT.
    Disconnect,
}

impl VmBootAction {
    /// Parses a VM_BOOT_OPTION value, case-insensitively.
    pub fn from_ribcl(s: &str) -> Option<Self> {
        match s.trim().to_ascii_uppercase().as_str() {
            "BOOT_ALWAYS" => Some(VmBootAction::Set(VmBootOption::BootAlways)),
            "BOOT_ONCE" => Some(VmBootAction::Set(VmBootOption::BootOnce)),
            "NO_BOOT" => Some(VmBootAction::Set(VmBootOption::NoBoot)),
            "CONNECT" => Some(VmBootAction::Connect),
            "DISCONNECT" => Some(VmBootAction::Disconnect),
            _ => None,
        }
    }
}

/// One virtual media drive.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct VirtualMedia {
    /// IMAGE_URL; `None` when no image is inserted.
    pub url: Option<String>,
    /// Image size learnt from the range read (Content-Range total), if the server said.
    pub image_size: Option<u64>,
    /// Whether the medium is connected to the host now (VM_APPLET="CONNECTED").
    pub connected: bool,
    /// VM_BOOT_OPTION.
    pub boot_option: VmBootOption,
    /// VM_WRITE_PROTECT.
    pub write_protect: bool,
}

impl VirtualMedia {
    fn empty(device: VmDevice) -> Self {
        VirtualMedia {
            url: None,
            image_size: None,
            connected: false,
            boot_option: VmBootOption::NoBoot,
            write_protect: device.default_write_protect(),
        }
    }

    /// IMAGE_INSERTED.
    pub fn inserted(&self) -> bool {
        self.url.is_some()
    }
}

/// The licence installed on the emulated iLO.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum License {
    /// iLO Standard: no scripted virtual media (as on real iLO 4).
    Standard,
    /// iLO Advanced: everything.
    Advanced,
}

impl License {
    /// Whether virtual media may be used.
    pub fn allows_virtual_media(self) -> bool {
        matches!(self, License::Advanced)
    }
}

/// What the last boot used (for tests and logs; a real iLO does not report this).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct BootRecord {
    /// The device booted from (`None`: nothing bootable, e.g. no medium in the chosen drive).
    pub device: Option<BootDevice>,
    /// Why that device: `one_time`, `vmedia_boot_once`, `persistent`.
    pub reason: &'static str,
    /// The firmware boot mode of this boot.
    pub mode: BootMode,
    /// The medium URL when it booted from virtual media.
    pub media_url: Option<String>,
    /// Set when the boot medium could not be read at boot (filled in by the server, which does
    /// the I/O).
    pub media_read_error: Option<String>,
    /// What reading the boot medium took (filled in by the server).
    pub media_read: Option<crate::media_fetch::BootReadStats>,
}

/// What a boot must do on the machine behind the emulator; returned by [`ServerState::boot`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BootPlan {
    /// Firmware mode for this boot.
    pub mode: BootMode,
    /// Device to boot.
    pub device: Option<BootDevice>,
    /// Media connected during this boot.
    pub media: Vec<(VmDevice, String)>,
    /// BOOT_ONCE media to detach once this boot has used them.
    pub detach_after_boot: Vec<VmDevice>,
    /// UEFI Secure Boot enforced in this boot (set, and the boot is UEFI).
    pub secure_boot: bool,
}

/// The whole state of one emulated server.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ServerState {
    /// Host power.
    pub power: Power,
    /// Boot mode in effect.
    pub boot_mode_current: BootMode,
    /// Boot mode the next boot applies.
    pub boot_mode_pending: BootMode,
    /// Supported modes.
    pub supported_boot_modes: SupportedBootModes,
    /// One-time boot, consumed by the next boot.
    pub one_time_boot: Option<OneTimeBoot>,
    /// Persistent boot order, first is tried first.
    pub persistent_boot: Vec<BootDevice>,
    /// A Redfish `BootSourceOverrideEnabled: Continuous` target (its device, if the machine has
    /// one, also heads the persistent order); reported back by Redfish, cleared by `Disabled`,
    /// a `Once` override or SET_PERSISTENT_BOOT. Never a firmware application
    /// ([`BootTarget::one_boot_only`]).
    pub continuous_override: Option<BootTarget>,
    /// FLOPPY then CDROM.
    pub vmedia: [VirtualMedia; 2],
    /// Licence.
    pub license: License,
    /// Boots since start.
    pub boots: u64,
    /// Secure Boot as set (`SecureBootEnable`); it takes effect at the next boot.
    pub secure_boot_enable: bool,
    /// Secure Boot in the running boot (`SecureBootCurrentBoot`).
    pub secure_boot_current: bool,
    /// A message id the BIOS answers every pending boot-mode change with instead of applying
    /// it, until cleared (set through the admin API: a BIOS that refuses the setting, e.g. for
    /// a BIOS password or a Secure Boot dependency).
    pub bios_reject: Option<String>,
    /// The result of the last BIOS settings apply, as Redfish `@Redfish.Settings.Messages`
    /// shows it: message ids, each with the attribute it names (if any).
    pub bios_settings_messages: Vec<(String, Option<String>)>,
    /// The last boot.
    pub last_boot: Option<BootRecord>,
    /// The last boot medium read (kept after later boots from disk, which read none).
    pub last_media_read: Option<crate::media_fetch::BootReadStats>,
}

/// A state transition refused the way iLO refuses it.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum StateError {
    /// The requested boot mode is not supported by this firmware.
    #[error("boot mode {0:?} is not supported")]
    BootModeNotSupported(BootMode),
    /// The server is off and cannot be reset.
    #[error("server is currently powered off")]
    PoweredOff,
    /// No image is inserted in the device.
    #[error("no image present in the virtual media drive")]
    NoImage,
}

impl ServerState {
    /// A fresh server: off, legacy, default boot order, empty drives.
    pub fn new(license: License, mode: BootMode, supported: SupportedBootModes) -> Self {
        ServerState {
            power: Power::Off,
            boot_mode_current: mode,
            boot_mode_pending: mode,
            supported_boot_modes: supported,
            one_time_boot: None,
            persistent_boot: DEFAULT_BOOT_ORDER.to_vec(),
            continuous_override: None,
            vmedia: [
                VirtualMedia::empty(VmDevice::Floppy),
                VirtualMedia::empty(VmDevice::Cdrom),
            ],
            license,
            boots: 0,
            secure_boot_enable: false,
            secure_boot_current: false,
            bios_reject: None,
            bios_settings_messages: Vec::new(),
            last_boot: None,
            last_media_read: None,
        }
    }

    /// A drive.
    pub fn vm(&self, device: VmDevice) -> &VirtualMedia {
        &self.vmedia[device.index()]
    }

    /// A drive, mutably.
    pub fn vm_mut(&mut self, device: VmDevice) -> &mut VirtualMedia {
        &mut self.vmedia[device.index()]
    }

    /// Sets the pending boot mode (applied at the next boot).
    pub fn set_pending_boot_mode(&mut self, mode: BootMode) -> Result<(), StateError> {
        if !self.supported_boot_modes.allows(mode) {
            return Err(StateError::BootModeNotSupported(mode));
        }
        self.boot_mode_pending = mode;
        Ok(())
    }

    /// SET_PERSISTENT_BOOT: the named devices move to the front in the given order; the rest
    /// keep their relative order behind them.
    pub fn set_persistent_boot(&mut self, devices: &[BootDevice]) {
        let mut order: Vec<BootDevice> = Vec::with_capacity(DEFAULT_BOOT_ORDER.len());
        for d in devices {
            if !order.contains(d) {
                order.push(*d);
            }
        }
        for d in &self.persistent_boot {
            if !order.contains(d) {
                order.push(*d);
            }
        }
        self.persistent_boot = order;
    }

    /// A Boot override change (Redfish and RIS `Boot` PATCH): `Once` sets the one-time boot,
    /// `Continuous` heads the persistent order, `Disabled` or the `None` target clears; what
    /// the change leaves out stays as it was. RIBCL reads the result back.
    pub fn apply_boot_override(
        &mut self,
        target: Option<crate::boot_target::BootTarget>,
        enabled: Option<&str>,
    ) {
        use crate::boot_target::BootTarget;
        // The target in effect: the new one, or the one already set.
        let current = self
            .one_time_boot
            .map(OneTimeBoot::target)
            .or(self.continuous_override);
        let target = target.or(current).unwrap_or(BootTarget::None);
        let enabled = enabled.unwrap_or(if self.continuous_override.is_some() {
            "Continuous"
        } else {
            "Once"
        });
        match (enabled, target) {
            ("Disabled", _) | (_, BootTarget::None) => {
                self.one_time_boot = None;
                self.continuous_override = None;
            }
            // A firmware application never enters the persistent order: Continuous acts as
            // Once (see crate::boot_target).
            ("Continuous", t) if !t.one_boot_only() => {
                self.one_time_boot = None;
                self.continuous_override = Some(t);
                if let Some(d) = t.device() {
                    self.set_persistent_boot(&[d]);
                }
            }
            (_, t) => {
                self.continuous_override = None;
                self.one_time_boot = OneTimeBoot::from_target(t);
            }
        }
    }

    /// Inserts an image (the fetch has already succeeded). The boot option is left as it was and
    /// the medium is not connected until CONNECT or a boot (docs/ilo-management.md §1.5).
    pub fn insert(&mut self, device: VmDevice, url: String, image_size: Option<u64>) {
        let vm = self.vm_mut(device);
        vm.url = Some(url);
        vm.image_size = image_size;
    }

    /// Ejects an image: the drive returns to its defaults.
    pub fn eject(&mut self, device: VmDevice) -> Result<(), StateError> {
        if !self.vm(device).inserted() {
            return Err(StateError::NoImage);
        }
        *self.vm_mut(device) = VirtualMedia::empty(device);
        Ok(())
    }

    /// SET_VM_STATUS VM_BOOT_OPTION.
    pub fn set_vm_boot(&mut self, device: VmDevice, action: VmBootAction) {
        let vm = self.vm_mut(device);
        match action {
            VmBootAction::Set(option) => vm.boot_option = option,
            VmBootAction::Connect => {
                vm.connected = vm.url.is_some();
                vm.boot_option = VmBootOption::BootAlways;
            }
            VmBootAction::Disconnect => {
                vm.connected = false;
                vm.boot_option = VmBootOption::NoBoot;
            }
        }
    }

    /// Powers on from off; `None` when already on.
    pub fn power_on(&mut self) -> Option<BootPlan> {
        if self.power == Power::On {
            return None;
        }
        self.power = Power::On;
        Some(self.boot())
    }

    /// Powers off; `false` when already off.
    pub fn power_off(&mut self) -> bool {
        if self.power == Power::Off {
            return false;
        }
        self.power = Power::Off;
        true
    }

    /// Warm reset of a running server.
    pub fn reset(&mut self) -> Result<BootPlan, StateError> {
        if self.power == Power::Off {
            return Err(StateError::PoweredOff);
        }
        Ok(self.boot())
    }

    /// One boot: apply the pending mode, choose the device, consume the one-time boot and
    /// BOOT_ONCE media.
    fn boot(&mut self) -> BootPlan {
        self.secure_boot_current =
            self.secure_boot_enable && self.boot_mode_pending == BootMode::Uefi;
        if self.boot_mode_pending != self.boot_mode_current {
            // The BIOS applies its pending settings at boot, or refuses them and says so.
            match &self.bios_reject {
                Some(id) => {
                    self.boot_mode_pending = self.boot_mode_current;
                    self.bios_settings_messages = vec![(id.clone(), Some("BootMode".into()))];
                }
                None => {
                    self.boot_mode_current = self.boot_mode_pending;
                    self.bios_settings_messages = vec![("Base.1.0.Success".into(), None)];
                }
            }
        }
        self.boots += 1;
        // Media connected for this boot: BOOT_ALWAYS / BOOT_ONCE with an image, or CONNECTed.
        let mut media = Vec::new();
        let mut boot_once = None;
        for device in [VmDevice::Floppy, VmDevice::Cdrom] {
            let vm = self.vm(device);
            if let Some(url) = &vm.url {
                let boots_now = vm.boot_option != VmBootOption::NoBoot;
                if boots_now || vm.connected {
                    media.push((device, url.clone()));
                }
                if vm.boot_option == VmBootOption::BootOnce && boot_once.is_none() {
                    boot_once = Some(device);
                }
            }
        }
        let bootable = |d: BootDevice, media: &[(VmDevice, String)]| match d {
            BootDevice::Cdrom => media.iter().any(|(v, _)| *v == VmDevice::Cdrom),
            BootDevice::Floppy => media.iter().any(|(v, _)| *v == VmDevice::Floppy),
            BootDevice::Usb | BootDevice::Rbsu => false,
            BootDevice::Hdd | BootDevice::Network => true,
        };
        let first_in_order = self
            .persistent_boot
            .iter()
            .copied()
            .find(|d| bootable(*d, &media));
        let (device, reason) = if let Some(one) = self.one_time_boot.take() {
            match one {
                OneTimeBoot::Device(d) => (Some(d), "one_time"),
                OneTimeBoot::Embedded(_) => (None, "one_time"),
                // The UEFI shell is a firmware application like the EMB-* ones (no device); a
                // device the machine does not have (an SD card, a UEFI device path) holds
                // nothing, and the firmware falls through to the boot order.
                OneTimeBoot::Redfish(t) if t.one_boot_only() => (t.device(), "one_time"),
                OneTimeBoot::Redfish(t) => (t.device().or(first_in_order), "one_time"),
            }
        } else if let Some(vm) = boot_once {
            (Some(vm.boot_device()), "vmedia_boot_once")
        } else {
            (first_in_order, "persistent")
        };
        let media_url = device.and_then(|d| {
            media
                .iter()
                .find(|(v, _)| v.boot_device() == d)
                .map(|(_, u)| u.clone())
        });
        // BOOT_ONCE media are spent by this boot: NO_BOOT, no image, write protect off
        // (docs/ilo-management.md §1.5, HP iLO 2 guide 28418).
        let mut detach_after_boot = Vec::new();
        for device in [VmDevice::Floppy, VmDevice::Cdrom] {
            let vm = self.vm_mut(device);
            if vm.url.is_some() && vm.boot_option == VmBootOption::BootOnce {
                *vm = VirtualMedia::empty(device);
                vm.write_protect = false;
                detach_after_boot.push(device);
            } else if vm.url.is_some() && vm.boot_option == VmBootOption::BootAlways {
                vm.connected = true;
            }
        }
        self.last_boot = Some(BootRecord {
            device,
            reason,
            mode: self.boot_mode_current,
            media_url,
            media_read_error: None,
            media_read: None,
        });
        BootPlan {
            mode: self.boot_mode_current,
            device,
            media,
            detach_after_boot,
            secure_boot: self.secure_boot_current,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fresh() -> ServerState {
        ServerState::new(
            License::Advanced,
            BootMode::Legacy,
            SupportedBootModes::LegacyUefi,
        )
    }

    #[test]
    fn pending_boot_mode_applies_at_next_boot_only() {
        let mut s = fresh();
        s.set_pending_boot_mode(BootMode::Uefi).expect("supported");
        assert_eq!(s.boot_mode_current, BootMode::Legacy);
        let plan = s.power_on().expect("was off");
        assert_eq!(plan.mode, BootMode::Uefi);
        assert_eq!(s.boot_mode_current, BootMode::Uefi);
    }

    #[test]
    fn unsupported_boot_mode_is_refused() {
        let mut s = ServerState::new(
            License::Advanced,
            BootMode::Legacy,
            SupportedBootModes::LegacyOnly,
        );
        assert_eq!(
            s.set_pending_boot_mode(BootMode::Uefi),
            Err(StateError::BootModeNotSupported(BootMode::Uefi))
        );
    }

    #[test]
    fn one_time_boot_is_consumed() {
        let mut s = fresh();
        s.one_time_boot = Some(OneTimeBoot::Device(BootDevice::Network));
        let plan = s.power_on().expect("was off");
        assert_eq!(plan.device, Some(BootDevice::Network));
        assert_eq!(s.one_time_boot, None);
        let plan = s.reset().expect("is on");
        // CD first in the order but empty, floppy empty, USB not bootable: HDD.
        assert_eq!(plan.device, Some(BootDevice::Hdd));
    }

    #[test]
    fn network_boots_once_or_persistently() {
        let mut s = fresh();
        // One-time NETWORK: this boot only, then the persistent order (HDD: the drives are
        // empty and USB has nothing).
        s.one_time_boot = Some(OneTimeBoot::Device(BootDevice::Network));
        let plan = s.power_on().expect("was off");
        assert_eq!(plan.device, Some(BootDevice::Network));
        assert_eq!(s.last_boot.as_ref().map(|b| b.reason), Some("one_time"));
        let plan = s.reset().expect("on");
        assert_eq!(plan.device, Some(BootDevice::Hdd));
        assert_eq!(s.last_boot.as_ref().map(|b| b.reason), Some("persistent"));
        // SET_PERSISTENT_BOOT with NETWORK first: every boot, in UEFI too.
        s.set_persistent_boot(&[BootDevice::Network]);
        s.set_pending_boot_mode(BootMode::Uefi).expect("supported");
        for _ in 0..2 {
            let plan = s.reset().expect("on");
            assert_eq!(plan.device, Some(BootDevice::Network));
            assert_eq!(plan.mode, BootMode::Uefi);
            assert_eq!(s.last_boot.as_ref().map(|b| b.reason), Some("persistent"));
        }
    }

    #[test]
    fn secure_boot_is_enforced_from_the_next_uefi_boot_only() {
        let mut s = fresh();
        s.secure_boot_enable = true;
        s.boot_mode_pending = BootMode::Legacy;
        assert!(!s.power_on().expect("was off").secure_boot, "legacy boot");
        s.boot_mode_pending = BootMode::Uefi;
        let plan = s.reset().expect("on");
        assert!(plan.secure_boot && s.secure_boot_current);
        s.secure_boot_enable = false;
        assert!(s.secure_boot_current, "the running boot keeps it");
        assert!(!s.reset().expect("on").secure_boot);
    }

    #[test]
    fn boot_once_media_is_used_once_then_ejected() {
        let mut s = fresh();
        s.insert(VmDevice::Cdrom, "http://x/a.iso".into(), None);
        s.set_vm_boot(VmDevice::Cdrom, VmBootAction::Set(VmBootOption::BootOnce));
        let plan = s.power_on().expect("was off");
        assert_eq!(plan.device, Some(BootDevice::Cdrom));
        assert_eq!(plan.detach_after_boot, vec![VmDevice::Cdrom]);
        let cd = s.vm(VmDevice::Cdrom);
        assert!(!cd.inserted());
        assert_eq!(cd.boot_option, VmBootOption::NoBoot);
        assert!(!cd.write_protect);
        assert_eq!(
            s.last_boot.as_ref().and_then(|b| b.media_url.clone()),
            Some("http://x/a.iso".into())
        );
    }

    #[test]
    fn connect_sets_boot_always_and_persists_across_boots() {
        let mut s = fresh();
        s.insert(VmDevice::Cdrom, "http://x/a.iso".into(), None);
        s.set_vm_boot(VmDevice::Cdrom, VmBootAction::Connect);
        assert!(s.vm(VmDevice::Cdrom).connected);
        assert_eq!(s.vm(VmDevice::Cdrom).boot_option, VmBootOption::BootAlways);
        s.power_on();
        s.reset().expect("on");
        assert!(s.vm(VmDevice::Cdrom).inserted());
        assert_eq!(
            s.last_boot.as_ref().and_then(|b| b.device),
            Some(BootDevice::Cdrom)
        );
    }

    #[test]
    fn persistent_boot_moves_named_devices_first() {
        let mut s = fresh();
        s.set_persistent_boot(&[BootDevice::Network, BootDevice::Hdd]);
        assert_eq!(
            s.persistent_boot,
            vec![
                BootDevice::Network,
                BootDevice::Hdd,
                BootDevice::Cdrom,
                BootDevice::Floppy,
                BootDevice::Usb
            ]
        );
    }

    #[test]
    fn eject_of_empty_drive_is_an_error_and_reset_when_off_too() {
        let mut s = fresh();
        assert_eq!(s.eject(VmDevice::Floppy), Err(StateError::NoImage));
        assert_eq!(s.reset(), Err(StateError::PoweredOff));
        assert!(!s.power_off());
    }

    #[test]
    fn uefi_ids_round_trip() {
        for d in DEFAULT_BOOT_ORDER {
            for (id, _) in d.uefi_options() {
                assert_eq!(BootDevice::from_uefi_id(id), Some(d));
            }
        }
    }
}
