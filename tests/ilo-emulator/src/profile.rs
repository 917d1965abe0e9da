//! Firmware profiles: who an emulated iLO says it is and which real-firmware behaviours
//! ("quirks") it reproduces (docs/ilo-firmware.md).
//!
//! # Design
//! A [`Profile`] is an [`Identity`] (model, firmware strings, message registries), a set of
//! [`Quirk`] switches and the [`Timings`] of the host. The named profiles follow one iLO
//! generation and firmware line each; `--quirk NAME[=on|off]` toggles one switch on top of a
//! profile, so a test can show that a driver needs its handling of exactly that behaviour.
//! Where no source pins a behaviour down, the switch exists and the profile turns on the harder
//! variant.
//!
//! The default profile, `lab`, is the emulator as it was before profiles: RIBCL and Redfish
//! both answer, nothing is refused that a well-behaved client would send. The six firmware
//! profiles are opt-in.

use std::collections::BTreeSet;
use std::fmt;
use std::str::FromStr;
use std::time::Duration;

use serde::Serialize;

/// One real-firmware behaviour the emulator can reproduce.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Quirk {
    /// `/redfish/v1` answers 404: iLO 4 before 2.30 has no Redfish.
    NoRedfish,
    /// Every RIBCL script is refused with `RIBCLI is disabled` (iLO 6; iLO 5 with
    /// `Oem.Hpe.RIBCLEnabled` false); `Managers/1` reports `RIBCLEnabled: false`.
    RibclDisabled,
    /// A Redfish URI without its trailing slash answers 308 to the URI with it (iLO 5 < 1.40).
    TrailingSlash308,
    /// VirtualMedia v1_0_0: only the HPE OEM insert/eject actions; the standard ones are 404
    /// (iLO 5 1.1x).
    VmediaOemActionsOnly,
    /// An OEM eject POST without a body answers 415 (iLO 5 1.x).
    EjectEmptyBody415,
    /// `Boot.BootSourceOverrideMode` is read-only: a PATCH carrying it, even with the current
    /// value, answers 400 `UnsupportedOperation` (iLO 5/6); the mode changes through BIOS.
    BootModeOverrideReadonly,
    /// A Boot PATCH with any property other than the override target and enabled (and the UEFI
    /// target with `UefiTarget`), or an empty string, answers 400 `PropertyNotWritableOrUnknown`
    /// naming it (iLO 6).
    StrictBootPatch,
    /// `ComputerSystem.Reset` within [`Timings::reset_window`] of the previous power change, or
    /// asking for the state the host is already in, answers 400
    /// `InvalidOperationForSystemState` (iLO 5/6).
    ResetWindow,
    /// After power-on or reset the host is in POST for [`Timings::post`]; a boot override
    /// PATCH then answers 400 `UnableToModifyDuringSystemPOST`.
    PostRefusesBootChanges,
    /// Only the CD slot has `Oem.Hpe.BootOnNextServerReset`; PATCHing it on the floppy answers
    /// 400 `PropertyNotWritableOrUnknown` (every generation).
    BootOnceCdOnly,
    /// Every reply body is sent with `Transfer-Encoding: chunked`, never `Content-Length`
    /// (iLO 5 and later).
    Chunked,
    /// A session login while [`Timings::session_cap`] sessions are open answers 403
    /// `SessionLimitExceeded`: sessions that clients leave open fill the table until they idle
    /// out (iLO 5/6; the cap is not published, the status is the harder guess).
    SessionLimit,
    /// In UEFI mode RIBCL `GET_PERSISTENT_BOOT` lists the virtual CD's `Boot####` entry only
    /// while an image is connected, and `SET_PERSISTENT_BOOT` naming an entry not listed is
    /// refused (iLO 4 UEFI).
    UefiCdEntryWhenConnected,
    /// `Managers/1` has no `PowerState` (iLO 6 1.70).
    ManagerNoPowerState,
    /// A Redfish request body without `Content-Type: application/json` answers 415 (iLO 4
    /// Gen9).
    ContentTypeRequired,
    /// The HP RESTful API ("RIS") answers under `/rest/v1` beside RIBCL (iLO 4 on a Gen9,
    /// firmware 2.x; [`crate::ris`]). Off, `/rest/v1` is 404 on iLO 4; iLO 5 and 6 redirect it
    /// to Redfish either way.
    Ris,
    /// Redfish error bodies carry message ids and arguments only: no `Message` text in
    /// `@Message.ExtendedInfo`, and `error.message` says to see it (iLO 5/6; the text is in
    /// registries a client would download).
    ErrorIdsOnly,
    /// In UEFI mode RIBCL `GET_ONE_TIME_BOOT` answers a device as its entry's
    /// `(VALUE="Boot####", DESCRIPTION)` pair rather than a device word (iLO 6 with RIBCL
    /// enabled; the XML shape is inferred from python-hpilo's tuple handling).
    RibclBootPair,
}

impl Quirk {
    /// Every quirk, in listing order.
    pub const ALL: [Quirk; 18] = [
        Quirk::NoRedfish,
        Quirk::RibclDisabled,
        Quirk::TrailingSlash308,
        Quirk::VmediaOemActionsOnly,
        Quirk::EjectEmptyBody415,
        Quirk::BootModeOverrideReadonly,
        Quirk::StrictBootPatch,
        Quirk::ResetWindow,
        Quirk::PostRefusesBootChanges,
        Quirk::BootOnceCdOnly,
        Quirk::Chunked,
        Quirk::SessionLimit,
        Quirk::UefiCdEntryWhenConnected,
        Quirk::ManagerNoPowerState,
        Quirk::ContentTypeRequired,
        Quirk::Ris,
        Quirk::ErrorIdsOnly,
        Quirk::RibclBootPair,
    ];

    /// The switch's name on the command line and in the admin API.
    pub fn name(self) -> &'static str {
        match self {
            Quirk::NoRedfish => "no-redfish",
            Quirk::RibclDisabled => "ribcl-disabled",
            Quirk::TrailingSlash308 => "trailing-slash-308",
            Quirk::VmediaOemActionsOnly => "vmedia-oem-actions-only",
            Quirk::EjectEmptyBody415 => "eject-empty-body-415",
            Quirk::BootModeOverrideReadonly => "boot-mode-override-readonly",
            Quirk::StrictBootPatch => "strict-boot-patch",
            Quirk::ResetWindow => "reset-window",
            Quirk::PostRefusesBootChanges => "post-refuses-boot-changes",
            Quirk::BootOnceCdOnly => "boot-once-cd-only",
            Quirk::Chunked => "chunked",
            Quirk::SessionLimit => "session-limit",
            Quirk::UefiCdEntryWhenConnected => "uefi-cd-entry-when-connected",
            Quirk::ManagerNoPowerState => "manager-no-power-state",
            Quirk::ContentTypeRequired => "content-type-required",
            Quirk::Ris => "ris",
            Quirk::ErrorIdsOnly => "error-ids-only",
            Quirk::RibclBootPair => "ribcl-boot-pair",
        }
    }

    /// One line for `--list-profiles`.
    pub fn summary(self) -> &'static str {
        match self {
            Quirk::NoRedfish => "/redfish/v1 is 404 (iLO 4 before 2.30)",
            Quirk::RibclDisabled => "RIBCL refused: \"RIBCLI is disabled\" (iLO 6)",
            Quirk::TrailingSlash308 => "308 to the URI with its trailing slash (iLO 5 < 1.40)",
            Quirk::VmediaOemActionsOnly => "virtual media by HPE OEM actions only (iLO 5 1.1x)",
            Quirk::EjectEmptyBody415 => "OEM eject without a body is 415 (iLO 5 1.x)",
            Quirk::BootModeOverrideReadonly => {
                "BootSourceOverrideMode in a PATCH is 400 UnsupportedOperation"
            }
            Quirk::StrictBootPatch => {
                "unknown or empty Boot properties are 400 PropertyNotWritableOrUnknown"
            }
            Quirk::ResetWindow => {
                "reset soon after a power change, or to the same state, is 400 InvalidOperationForSystemState"
            }
            Quirk::PostRefusesBootChanges => {
                "boot changes during POST are 400 UnableToModifyDuringSystemPOST"
            }
            Quirk::BootOnceCdOnly => "BootOnNextServerReset exists on the CD slot only",
            Quirk::Chunked => "every body chunked, no Content-Length (iLO 5 and later)",
            Quirk::SessionLimit => "a login with the session table full is 403 SessionLimitExceeded",
            Quirk::UefiCdEntryWhenConnected => {
                "RIBCL UEFI boot order lists the virtual CD only while connected (iLO 4)"
            }
            Quirk::ManagerNoPowerState => "Managers/1 without PowerState (iLO 6 1.70)",
            Quirk::ContentTypeRequired => {
                "a Redfish body without Content-Type: application/json is 415 (iLO 4 Gen9)"
            }
            Quirk::Ris => "HP RESTful API /rest/v1 (iLO 4 Gen9, firmware 2.x)",
            Quirk::ErrorIdsOnly => "Redfish errors: message ids and arguments, no text (iLO 5/6)",
            Quirk::RibclBootPair => {
                "RIBCL UEFI one-time boot as a (Boot####, description) pair (iLO 6)"
            }
        }
    }
}

impl fmt::Display for Quirk {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for Quirk {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Quirk::ALL
            .into_iter()
            .find(|q| q.name() == s)
            .ok_or_else(|| {
                let names: Vec<&str> = Quirk::ALL.iter().map(|q| q.name()).collect();
                format!("unknown quirk {s:?} (known: {})", names.join(", "))
            })
    }
}

/// `NAME`, `NAME=on` or `NAME=off`, as `--quirk` takes it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct QuirkSwitch {
    /// Which quirk.
    pub quirk: Quirk,
    /// On or off.
    pub on: bool,
}

impl FromStr for QuirkSwitch {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let (name, on) = match s.split_once('=') {
            None => (s, true),
            Some((name, "on")) => (name, true),
            Some((name, "off")) => (name, false),
            Some((_, other)) => return Err(format!("quirk value {other:?}: on or off")),
        };
        Ok(QuirkSwitch {
            quirk: name.parse()?,
            on,
        })
    }
}

/// The iLO generation, as the unauthenticated `xmldata` and RIBCL name it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub enum Generation {
    /// iLO 4 (Gen8, Gen9).
    Ilo4,
    /// iLO 5 (Gen10, Gen10 Plus).
    Ilo5,
    /// iLO 6 (Gen11).
    Ilo6,
}

impl Generation {
    /// `xmldata` `MP/PN`.
    pub fn product_name(self) -> &'static str {
        match self {
            Generation::Ilo4 => "Integrated Lights-Out 4 (iLO 4)",
            Generation::Ilo5 => "Integrated Lights-Out 5 (iLO 5)",
            Generation::Ilo6 => "Integrated Lights-Out 6 (iLO 6)",
        }
    }

    /// RIBCL `GET_FW_VERSION` `MANAGEMENT_PROCESSOR`.
    pub fn management_processor(self) -> &'static str {
        match self {
            Generation::Ilo4 => "iLO4",
            Generation::Ilo5 => "iLO5",
            Generation::Ilo6 => "iLO6",
        }
    }

    /// Redfish `Managers/1 Model`, licence names ("iLO 5 Advanced").
    pub fn model(self) -> &'static str {
        match self {
            Generation::Ilo4 => "iLO 4",
            Generation::Ilo5 => "iLO 5",
            Generation::Ilo6 => "iLO 6",
        }
    }
}

/// Who the iLO says it is.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Identity {
    /// The server model (`GET_PRODUCT_NAME`, `xmldata HSI/SPN`, `Systems/1 Model`).
    pub product: &'static str,
    /// The iLO generation.
    pub generation: Generation,
    /// Firmware `MAJOR.MINOR` (`GET_FW_VERSION`, `xmldata MP/FWRI`).
    pub firmware: &'static str,
    /// Firmware date as RIBCL prints it.
    pub firmware_date: &'static str,
    /// The iLO message registry prefix of Redfish errors (`iLO.2.14`).
    pub ilo_registry: &'static str,
    /// The Base message registry prefix (`Base.1.4`).
    pub base_registry: &'static str,
    /// `ResetType@Redfish.AllowableValues` of `ComputerSystem.Reset`.
    pub reset_types: &'static [&'static str],
}

impl Identity {
    /// `Managers/1 FirmwareVersion`: "iLO 5 v2.72".
    pub fn firmware_version(&self) -> String {
        format!("{} v{}", self.generation.model(), self.firmware)
    }

    /// An iLO registry message id: `iLO.2.14.<name>`.
    pub fn ilo_message(&self, name: &str) -> String {
        format!("{}.{name}", self.ilo_registry)
    }

    /// A Base registry message id: `Base.1.4.<name>`.
    pub fn base_message(&self, name: &str) -> String {
        format!("{}.{name}", self.base_registry)
    }
}

/// How long the host takes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct Timings {
    /// POST after power-on or reset ([`Quirk::PostRefusesBootChanges`]; `Oem.Hpe.PostState`
    /// reads `InPost` meanwhile).
    pub post: Duration,
    /// After a power change, the time in which another reset is refused
    /// ([`Quirk::ResetWindow`]).
    pub reset_window: Duration,
    /// Redfish sessions open at once past which logins are refused
    /// ([`Quirk::SessionLimit`]).
    pub session_cap: usize,
}

impl Default for Timings {
    fn default() -> Self {
        // No source gives real durations (docs/ilo-quirks.md §2, "Timing"); short enough for the
        // test command, long enough that a client which does not retry fails.
        Timings {
            post: Duration::from_millis(1500),
            reset_window: Duration::from_millis(1500),
            // HPE publishes no REST session cap (docs/ilo-quirks.md §1); small enough that a
            // leaking client meets it within one test.
            session_cap: 10,
        }
    }
}

/// A named firmware behaviour: identity, quirks and timings.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Profile {
    /// `--profile` name.
    pub name: &'static str,
    /// One line for `--list-profiles`.
    pub summary: &'static str,
    /// Who it says it is.
    pub identity: Identity,
    /// The quirks switched on.
    pub quirks: BTreeSet<Quirk>,
    /// Host timings.
    pub timings: Timings,
}

const RESET_5: &[&str] = &["On", "ForceOff", "ForceRestart", "Nmi", "PushPowerButton"];
const RESET_7: &[&str] = &[
    "On",
    "ForceOff",
    "GracefulShutdown",
    "ForceRestart",
    "Nmi",
    "PushPowerButton",
    "GracefulRestart",
];
const RESET_9: &[&str] = &[
    "On",
    "ForceOff",
    "GracefulShutdown",
    "ForceRestart",
    "Nmi",
    "PushPowerButton",
    "GracefulRestart",
    "ForceOn",
    "PowerCycle",
];

/// The profile names, in listing order; the first is the default.
pub const NAMES: [&str; 7] = [
    "lab",
    "ilo4-gen8-ribcl",
    "ilo4-gen9-2.7x",
    "ilo5-1.1x",
    "ilo5-2.7x",
    "ilo5-3.x",
    "ilo6-1.6x",
];

impl Profile {
    /// The profile called `name`.
    pub fn named(name: &str) -> Result<Profile, String> {
        use Quirk::*;
        let quirks = |list: &[Quirk]| list.iter().copied().collect::<BTreeSet<_>>();
        let (name, summary, identity, on) = match name {
            "lab" => (
                "lab",
                "idealised iLO: RIBCL and Redfish, no quirks (the default)",
                Identity {
                    product: crate::config::DEFAULT_PRODUCT,
                    generation: Generation::Ilo4,
                    firmware: "2.55",
                    firmware_date: "Aug 16 2017",
                    ilo_registry: "iLO.2.14",
                    base_registry: "Base.1.4",
                    // Every reset the emulator implements (PowerCycle and ForceOn too).
                    reset_types: RESET_9,
                },
                quirks(&[]),
            ),
            "ilo4-gen8-ribcl" => (
                "ilo4-gen8-ribcl",
                "iLO 4 2.10 on a Gen8: RIBCL only",
                Identity {
                    product: "ProLiant DL380p Gen8",
                    generation: Generation::Ilo4,
                    firmware: "2.10",
                    firmware_date: "Jan 15 2015",
                    ilo_registry: "iLO.0.10",
                    base_registry: "Base.0.10",
                    reset_types: RESET_5,
                },
                quirks(&[NoRedfish, BootOnceCdOnly, UefiCdEntryWhenConnected]),
            ),
            "ilo4-gen9-2.7x" => (
                "ilo4-gen9-2.7x",
                "iLO 4 2.70 on a Gen9: RIBCL, RIS (/rest/v1) and a partial Redfish",
                Identity {
                    product: "ProLiant DL360 Gen9",
                    generation: Generation::Ilo4,
                    firmware: "2.70",
                    firmware_date: "May 07 2019",
                    ilo_registry: "iLO.0.10",
                    base_registry: "Base.0.10",
                    reset_types: RESET_5,
                },
                quirks(&[
                    BootOnceCdOnly,
                    ResetWindow,
                    UefiCdEntryWhenConnected,
                    ContentTypeRequired,
                    Ris,
                ]),
            ),
            "ilo5-1.1x" => (
                "ilo5-1.1x",
                "iLO 5 1.15 on a Gen10: 308 slash redirects, OEM-only virtual media",
                Identity {
                    product: "ProLiant DL180 Gen10",
                    generation: Generation::Ilo5,
                    firmware: "1.15",
                    firmware_date: "Aug 17 2017",
                    ilo_registry: "iLO.2.1",
                    base_registry: "Base.1.0",
                    reset_types: RESET_5,
                },
                quirks(&[
                    TrailingSlash308,
                    VmediaOemActionsOnly,
                    EjectEmptyBody415,
                    BootModeOverrideReadonly,
                    BootOnceCdOnly,
                    Chunked,
                    SessionLimit,
                    ErrorIdsOnly,
                ]),
            ),
            "ilo5-2.7x" => (
                "ilo5-2.7x",
                "iLO 5 2.72 on a Gen10 Plus: standard and OEM virtual media, POST and reset refusals",
                Identity {
                    product: "ProLiant DL385 Gen10 Plus v2",
                    generation: Generation::Ilo5,
                    firmware: "2.72",
                    firmware_date: "Sep 04 2022",
                    ilo_registry: "iLO.2.15",
                    base_registry: "Base.1.12",
                    reset_types: RESET_7,
                },
                quirks(&[
                    BootModeOverrideReadonly,
                    ResetWindow,
                    PostRefusesBootChanges,
                    BootOnceCdOnly,
                    Chunked,
                    SessionLimit,
                    ErrorIdsOnly,
                ]),
            ),
            "ilo5-3.x" => (
                "ilo5-3.x",
                "iLO 5 3.09: as 2.7x with newer registries and nine reset types",
                Identity {
                    product: "ProLiant DL360 Gen10 Plus",
                    generation: Generation::Ilo5,
                    firmware: "3.09",
                    firmware_date: "Oct 28 2024",
                    ilo_registry: "iLO.2.25",
                    base_registry: "Base.1.18",
                    reset_types: RESET_9,
                },
                quirks(&[
                    BootModeOverrideReadonly,
                    ResetWindow,
                    PostRefusesBootChanges,
                    BootOnceCdOnly,
                    Chunked,
                    SessionLimit,
                    ErrorIdsOnly,
                ]),
            ),
            "ilo6-1.6x" => (
                "ilo6-1.6x",
                "iLO 6 1.70 on a Gen11: RIBCL disabled, strict Boot PATCH",
                Identity {
                    product: "ProLiant DL380 Gen11",
                    generation: Generation::Ilo6,
                    firmware: "1.70",
                    firmware_date: "Jan 10 2025",
                    ilo_registry: "iLO.2.34",
                    base_registry: "Base.1.17",
                    reset_types: RESET_9,
                },
                quirks(&[
                    RibclDisabled,
                    BootModeOverrideReadonly,
                    StrictBootPatch,
                    ResetWindow,
                    PostRefusesBootChanges,
                    BootOnceCdOnly,
                    Chunked,
                    SessionLimit,
                    ErrorIdsOnly,
                    RibclBootPair,
                    ManagerNoPowerState,
                ]),
            ),
            other => {
                return Err(format!(
                    "unknown profile {other:?} (known: {})",
                    NAMES.join(", ")
                ))
            }
        };
        Ok(Profile {
            name,
            summary,
            identity,
            quirks: on,
            timings: Timings::default(),
        })
    }

    /// The default profile (`lab`).
    pub fn lab() -> Profile {
        match Profile::named("lab") {
            Ok(p) => p,
            Err(e) => unreachable!("the lab profile is defined: {e}"),
        }
    }

    /// Whether `quirk` is on.
    pub fn has(&self, quirk: Quirk) -> bool {
        self.quirks.contains(&quirk)
    }

    /// Turns switches on or off.
    pub fn with_switches(mut self, switches: &[QuirkSwitch]) -> Profile {
        for s in switches {
            if s.on {
                self.quirks.insert(s.quirk);
            } else {
                self.quirks.remove(&s.quirk);
            }
        }
        self
    }

    /// Turns one quirk on or off.
    pub fn with(self, quirk: Quirk, on: bool) -> Profile {
        self.with_switches(&[QuirkSwitch { quirk, on }])
    }

    /// The listing `--list-profiles` prints.
    pub fn listing() -> String {
        let mut out = String::from("profiles:\n");
        for name in NAMES {
            let Ok(p) = Profile::named(name) else {
                continue;
            };
            let quirks: Vec<&str> = p.quirks.iter().map(|q| q.name()).collect();
            out.push_str(&format!(
                "  {:<16} {} ({} {})\n  {:<16} quirks: {}\n",
                p.name,
                p.summary,
                p.identity.product,
                p.identity.firmware_version(),
                "",
                if quirks.is_empty() {
                    "none".to_string()
                } else {
                    quirks.join(", ")
                },
            ));
        }
        out.push_str("quirks (--quirk NAME[=on|off]):\n");
        for q in Quirk::ALL {
            out.push_str(&format!("  {:<28} {}\n", q.name(), q.summary()));
        }
        out
    }
}

impl Default for Profile {
    fn default() -> Self {
        Profile::lab()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_named_profile_exists_and_names_round_trip() {
        for name in NAMES {
            let p = Profile::named(name).expect(name);
            assert_eq!(p.name, name);
        }
        for q in Quirk::ALL {
            assert_eq!(q.name().parse::<Quirk>(), Ok(q));
        }
        assert!(Profile::named("ilo7").is_err());
        assert!("nonsense".parse::<Quirk>().is_err());
    }

    #[test]
    fn switches_toggle_one_quirk_on_a_profile() {
        let p = Profile::named("ilo6-1.6x").expect("profile");
        assert!(p.has(Quirk::RibclDisabled));
        let off: QuirkSwitch = "ribcl-disabled=off".parse().expect("switch");
        let on: QuirkSwitch = "no-redfish".parse().expect("switch");
        let p = p.with_switches(&[off, on]);
        assert!(!p.has(Quirk::RibclDisabled));
        assert!(p.has(Quirk::NoRedfish));
        assert!("chunked=maybe".parse::<QuirkSwitch>().is_err());
    }

    #[test]
    fn generations_follow_the_reference() {
        // docs/ilo-quirks.md §0: RIBCL off on iLO 6, no Redfish on a Gen8's iLO 4.
        assert!(Profile::named("ilo6-1.6x")
            .expect("p")
            .has(Quirk::RibclDisabled));
        assert!(Profile::named("ilo4-gen8-ribcl")
            .expect("p")
            .has(Quirk::NoRedfish));
        let ilo5 = Profile::named("ilo5-2.7x").expect("p");
        assert_eq!(ilo5.identity.firmware_version(), "iLO 5 v2.72");
        assert_eq!(
            ilo5.identity.ilo_message("InvalidOperationForSystemState"),
            "iLO.2.15.InvalidOperationForSystemState"
        );
        assert!(Profile::listing().contains("trailing-slash-308"));
        // RIS on the Gen9's iLO 4 only (§0).
        for name in NAMES {
            let p = Profile::named(name).expect("p");
            assert_eq!(p.has(Quirk::Ris), name == "ilo4-gen9-2.7x", "{name}");
        }
    }
}
