//! The operator's readiness probe of one iLO: read-only checks of what a virtual-media deploy
//! needs, each `ok`, `warn` or `fail` with what to do (docs/ilo-firmware.md, "Readiness probe";
//! the list follows docs/ilo-quirks.md, "Readiness checks").
//!
//! # Design
//! [`probe`] runs the checks in order and never stops early: an operator wants every problem
//! of an iLO at once. A check that cannot run because an earlier one failed (no connection, bad
//! credentials) is not reported; the earlier failure says why. Nothing is changed on the iLO:
//! only GETs, RIBCL reads and, with `--media-url`, a HEAD to the image server from here.

use std::time::{Duration, SystemTime};

use serde::Serialize;
use serde_json::Value;

use super::detect::{self, Detected};
use super::http::build_client;
use super::redfish::RedfishClient;
use super::{IloClient, IloConfig};
use crate::drivers::{
    virtual_media_licensed, DriverError, Inventory, Management, Power, PowerState, VirtualMedia,
    VmediaDevice,
};
use vmdeploy_shared::error::Chain;

/// A clock further off than this from the conductor's is reported.
pub const CLOCK_SKEW_WARN: Duration = Duration::from_secs(60);
/// Redfish sessions open at once past which leaked sessions are suspected (iLO's cap is not
/// published; a conductor keeps one per iLO).
pub const SESSIONS_WARN: usize = 8;

/// A check's outcome.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Status {
    /// Ready.
    Ok,
    /// A deploy may work, but something is off.
    Warn,
    /// A deploy will fail.
    Fail,
}

impl std::fmt::Display for Status {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // `pad`, so a width in the format string lines the columns up.
        f.pad(match self {
            Status::Ok => "ok",
            Status::Warn => "warn",
            Status::Fail => "fail",
        })
    }
}

/// One check.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Check {
    /// Short name (`licence`, `clock`).
    pub check: &'static str,
    /// Outcome.
    pub status: Status,
    /// What was found.
    pub detail: String,
    /// What to do, for a warning or a failure.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub action: Option<String>,
}

impl Check {
    fn ok(check: &'static str, detail: impl Into<String>) -> Check {
        Check {
            check,
            status: Status::Ok,
            detail: detail.into(),
            action: None,
        }
    }

    fn warn(check: &'static str, detail: impl Into<String>, action: impl Into<String>) -> Check {
        Check {
            check,
            status: Status::Warn,
            detail: detail.into(),
            action: Some(action.into()),
        }
    }

    fn fail(check: &'static str, detail: impl Into<String>, action: impl Into<String>) -> Check {
        Check {
            check,
            status: Status::Fail,
            detail: detail.into(),
            action: Some(action.into()),
        }
    }
}

/// Every check of one iLO.
#[derive(Debug, Clone, Serialize)]
pub struct Report {
    /// The iLO, as given.
    pub address: String,
    /// What its unauthenticated endpoints said (`None` when it could not be reached).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub detected: Option<DetectedSummary>,
    /// The checks in order.
    pub checks: Vec<Check>,
}

/// [`Detected`] as a report shows it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct DetectedSummary {
    /// iLO generation.
    pub generation: Option<u32>,
    /// Firmware `MAJOR.MINOR`.
    pub firmware: Option<String>,
    /// Server model.
    pub model: Option<String>,
    /// The protocol vmdeploy drives it with.
    pub protocol: String,
}

impl Report {
    /// Whether any check failed.
    pub fn failed(&self) -> bool {
        self.checks.iter().any(|c| c.status == Status::Fail)
    }

    /// Checks with `status`.
    pub fn count(&self, status: Status) -> usize {
        self.checks.iter().filter(|c| c.status == status).count()
    }

    /// The first failed check, if any.
    pub fn first_failure(&self) -> Option<&Check> {
        self.checks.iter().find(|c| c.status == Status::Fail)
    }

    /// One line per check.
    pub fn text(&self) -> String {
        let mut out = String::new();
        for c in &self.checks {
            out.push_str(&format!("{:<4}  {:<13} {}", c.status, c.check, c.detail));
            if let Some(action) = &c.action {
                out.push_str(&format!(" -> {action}"));
            }
            out.push('\n');
        }
        out
    }
}

/// The firmware checks for what was detected: old lines with known gaps.
fn firmware_check(detected: &Detected) -> Check {
    let version = detected.firmware.as_deref().unwrap_or("");
    let (major, minor) = version
        .split_once('.')
        .and_then(|(a, b)| Some((a.trim().parse::<u32>().ok()?, b.trim().parse::<u32>().ok()?)))
        .unwrap_or((0, 0));
    let named = format!(
        "iLO {} firmware {}",
        detected
            .generation
            .map_or_else(|| "?".to_string(), |g| g.to_string()),
        if version.is_empty() { "?" } else { version }
    );
    match detected.generation {
        None => Check::warn(
            "firmware",
            "not an HPE iLO, or /xmldata is switched off",
            "check the address; other Redfish BMCs work with the redfish driver",
        ),
        Some(4) if (major, minor) < (2, 30) => Check::warn(
            "firmware",
            format!("{named}: before 2.30, no Redfish"),
            "driven over RIBCL; update to iLO 4 2.80 or later when you can",
        ),
        Some(5) if (major, minor) < (1, 40) => Check::warn(
            "firmware",
            format!("{named}: before 1.40, slash redirects and OEM-only virtual media"),
            "handled; update iLO 5 (through 1.40 first) when you can",
        ),
        Some(g) if g < 4 => Check::fail(
            "firmware",
            format!("{named}: too old for virtual-media deploys"),
            "iLO 4 or later is needed",
        ),
        Some(_) => Check::ok("firmware", named),
    }
}

fn clock_check(bmc: Option<SystemTime>, now: SystemTime) -> Check {
    let Some(bmc) = bmc else {
        return Check::warn(
            "clock",
            "the iLO sent no Date header",
            "check the iLO's time (NTP) by hand",
        );
    };
    let (skew, ahead) = match bmc.duration_since(now) {
        Ok(d) => (d, true),
        Err(e) => (e.duration(), false),
    };
    let detail = format!(
        "{} s {} the conductor",
        skew.as_secs(),
        if ahead { "ahead of" } else { "behind" }
    );
    if skew > CLOCK_SKEW_WARN {
        Check::warn(
            "clock",
            detail,
            "set the iLO's NTP servers: temp URL expiry and certificates depend on agreeing clocks",
        )
    } else {
        Check::ok("clock", detail)
    }
}

async fn media_check(config: &IloConfig, url: &str) -> Check {
    let http = match build_client(&config.tls, config.timeout) {
        Ok(h) => h,
        Err(e) => return Check::fail("media-url", e.to_string(), "check --ca"),
    };
    match http.head(url).send().await {
        Err(e) => Check::fail(
            "media-url",
            format!("HEAD {}: {}", vmdeploy_shared::redact::Url(url), Chain(&e)),
            "the image server must answer from the management network",
        ),
        Ok(r) if !r.status().is_success() => Check::fail(
            "media-url",
            format!("HEAD answered {}", r.status()),
            "the image must be readable without credentials",
        ),
        Ok(r) => {
            let ranges = r
                .headers()
                .get(reqwest::header::ACCEPT_RANGES)
                .and_then(|v| v.to_str().ok())
                .unwrap_or("");
            let size = r
                .headers()
                .get(reqwest::header::CONTENT_LENGTH)
                .and_then(|v| v.to_str().ok())
                .unwrap_or("?")
                .to_string();
            if ranges.eq_ignore_ascii_case("bytes") {
                Check::ok("media-url", format!("{size} bytes, Accept-Ranges: bytes"))
            } else {
                Check::fail(
                    "media-url",
                    format!("{size} bytes, no Accept-Ranges: bytes"),
                    "iLO reads media by range: serve the image from a server that honours Range",
                )
            }
        }
    }
}

/// Redfish-only checks: interface switches, boot override, POST, sessions.
async fn redfish_checks(client: &RedfishClient, checks: &mut Vec<Check>) {
    let layout = match client.layout().await {
        Ok(l) => l.clone(),
        Err(e) => {
            checks.push(Check::fail("redfish", e.to_string(), "see the error"));
            return;
        }
    };
    if let Some(manager) = &layout.manager {
        if let Ok(m) = client.get(manager).await {
            match m.pointer("/Oem/Hpe/RIBCLEnabled").and_then(Value::as_bool) {
                Some(false) => checks.push(Check::warn(
                    "ribcl",
                    "RIBCL is disabled",
                    "vmdeploy uses Redfish here; tools that need RIBCL (hpilo, older proliantutils) will fail",
                )),
                Some(true) => checks.push(Check::ok("ribcl", "enabled")),
                None => {}
            }
        }
    }
    let system = client.get(&layout.system).await.ok();
    if let Some(system) = &system {
        let boot = system.get("Boot").cloned().unwrap_or(Value::Null);
        let enabled = boot
            .get("BootSourceOverrideEnabled")
            .and_then(Value::as_str)
            .unwrap_or("");
        let target = boot
            .get("BootSourceOverrideTarget")
            .and_then(Value::as_str)
            .unwrap_or("");
        if enabled == "Continuous" {
            checks.push(Check::warn(
                "boot-override",
                format!("stuck on Continuous, target {target}"),
                "clear it (BootSourceOverrideEnabled Disabled) or every boot goes there",
            ));
        } else {
            checks.push(Check::ok(
                "boot-override",
                format!(
                    "{}{}",
                    if enabled.is_empty() { "none" } else { enabled },
                    if target.is_empty() {
                        String::new()
                    } else {
                        format!(", target {target}")
                    }
                ),
            ));
        }
        match system.pointer("/Oem/Hpe/PostState").and_then(Value::as_str) {
            Some(post @ ("InPost" | "InPostDiscoveryComplete")) => checks.push(Check::warn(
                "post",
                format!("the host is in POST ({post})"),
                "boot changes are refused until POST ends; a host that stays there needs a look at its console",
            )),
            Some(post) => checks.push(Check::ok("post", post)),
            None => {}
        }
    }
    if let Some(system) = &system {
        if let Some(uri) = system
            .pointer("/SecureBoot/@odata.id")
            .and_then(Value::as_str)
        {
            if let Ok(sb) = client.get(uri).await {
                let current = sb
                    .get("SecureBootCurrentBoot")
                    .and_then(Value::as_str)
                    .unwrap_or("");
                let enable = sb.get("SecureBootEnable").and_then(Value::as_bool);
                if current == "Enabled" || enable == Some(true) {
                    checks.push(Check::warn(
                        "secure-boot",
                        format!("Secure Boot {current} (set: {})", enable.unwrap_or(false)),
                        "the deploy ISO and the instance must boot signed (shim), or turn Secure Boot off",
                    ));
                } else {
                    checks.push(Check::ok("secure-boot", "disabled"));
                }
            }
        }
    }
    if let Ok(sessions) = client.get("/redfish/v1/SessionService/Sessions/").await {
        let count = sessions
            .get("Members")
            .and_then(Value::as_array)
            .map_or(0, Vec::len);
        if count >= SESSIONS_WARN {
            checks.push(Check::warn(
                "sessions",
                format!("{count} sessions open"),
                "leaked sessions block logins when the iLO's cap is reached: delete the stale ones or reset the iLO",
            ));
        } else {
            checks.push(Check::ok("sessions", format!("{count} open")));
        }
    }
}

/// What the node behind the iLO will use, which decides what must be there.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Needs {
    /// Scripted virtual media (every driver but `pxe_ilo`): the licence must be Advanced.
    pub virtual_media: bool,
}

impl Default for Needs {
    fn default() -> Self {
        Needs {
            virtual_media: true,
        }
    }
}

/// Runs every check against the iLO of `config` (its protocol is probed whatever `config`
/// says); `media_url`: an image URL to HEAD from here.
pub async fn probe(config: &IloConfig, media_url: Option<&str>) -> Report {
    probe_for(config, media_url, Needs::default()).await
}

/// [`probe`] for a node that needs what `needs` says (a network-booted node needs no virtual
/// media licence).
pub async fn probe_for(config: &IloConfig, media_url: Option<&str>, needs: Needs) -> Report {
    let mut checks = Vec::new();
    let mut summary = None;
    let report = |checks, detected| Report {
        address: config.address.clone(),
        detected,
        checks,
    };
    let detected = match detect::detect(config).await {
        Ok(d) => d,
        Err(e @ DriverError::Tls { .. }) => {
            checks.push(Check::fail(
                "tls",
                e.to_string(),
                "fetch the iLO's certificate (openssl s_client -connect HOST:443 -showcerts), check it, and give it as --ca (ilo_verify_ca)",
            ));
            return report(checks, summary);
        }
        Err(e) => {
            checks.push(Check::fail(
                "reachable",
                e.to_string(),
                "check the address, the port and the route from the conductor to the management network",
            ));
            return report(checks, summary);
        }
    };
    checks.push(Check::ok(
        "reachable",
        config.base_url().unwrap_or_default(),
    ));
    checks.push(firmware_check(&detected));
    let protocol = detect::choose(&detected);
    summary = Some(DetectedSummary {
        generation: detected.generation,
        firmware: detected.firmware.clone(),
        model: detected.model.clone(),
        protocol: protocol.to_string(),
    });
    checks.push(Check::ok(
        "protocol",
        format!(
            "{protocol} (model {})",
            detected.model.as_deref().unwrap_or("?")
        ),
    ));
    let mut config = config.clone();
    config.protocol = protocol;
    let client = match IloClient::connect(&config).await {
        Ok(c) => c,
        Err(e) => {
            checks.push(Check::fail("credentials", e.to_string(), "see the error"));
            return report(checks, summary);
        }
    };
    let power = match client.power_state().await {
        Ok(p) => p,
        Err(e @ DriverError::LoginFailed { .. }) => {
            checks.push(Check::fail(
                "credentials",
                e.to_string(),
                "check the user name and password (the user needs the Virtual Media and Host BIOS privileges)",
            ));
            return report(checks, summary);
        }
        Err(e) => {
            checks.push(Check::fail("credentials", e.to_string(), "see the error"));
            return report(checks, summary);
        }
    };
    checks.push(Check::ok("credentials", "accepted"));
    checks.push(Check::ok(
        "power",
        match power {
            PowerState::On => "on",
            PowerState::Off => "off",
        },
    ));
    match client.licences().await {
        // Another vendor's Redfish BMC has no iLO licence to check.
        Ok(licences) if licences.is_empty() && detected.generation.is_none() => {
            checks.push(Check::ok("licence", "none reported (not an HPE iLO)"))
        }
        Ok(licences) if virtual_media_licensed(&licences) => checks.push(Check::ok(
            "licence",
            licences
                .iter()
                .map(|l| l.licence_type.clone())
                .collect::<Vec<_>>()
                .join(", "),
        )),
        Ok(licences) if !needs.virtual_media => checks.push(Check::ok(
            "licence",
            format!(
                "{} (no virtual media: the node boots from the network)",
                licences
                    .iter()
                    .map(|l| l.licence_type.clone())
                    .collect::<Vec<_>>()
                    .join(", ")
            ),
        )),
        Ok(licences) => checks.push(Check::fail(
            "licence",
            format!(
                "{}: no scripted virtual media",
                licences
                    .iter()
                    .map(|l| l.licence_type.clone())
                    .collect::<Vec<_>>()
                    .join(", ")
            ),
            "install an iLO Advanced licence",
        )),
        Err(e) => checks.push(Check::warn(
            "licence",
            e.to_string(),
            "check the licence by hand",
        )),
    }
    for device in [VmediaDevice::Floppy, VmediaDevice::Cdrom] {
        let name = match device {
            VmediaDevice::Floppy => "vmedia-floppy",
            VmediaDevice::Cdrom => "vmedia-cd",
        };
        match client.vmedia_status(device).await {
            Ok(s) if s.inserted => checks.push(Check::warn(
                name,
                format!(
                    "stale media inserted: {}",
                    s.image_url
                        .as_deref()
                        .map(|u| vmdeploy_shared::redact::Url(u).to_string())
                        .unwrap_or_default()
                ),
                format!("eject it: vmdeploy-conductor ilo ... vmedia eject {device}"),
            )),
            Ok(_) => checks.push(Check::ok(name, "empty")),
            // Refused for the licence: the licence check said so already.
            Err(DriverError::NotLicensed { .. }) => {}
            Err(e) => checks.push(Check::warn(
                name,
                e.to_string(),
                "check virtual media by hand",
            )),
        }
    }
    match (
        client.current_boot_mode().await,
        client.pending_boot_mode().await,
    ) {
        (Ok(current), Ok(pending)) if current != pending => checks.push(Check::warn(
            "boot-mode",
            format!("{current}, {pending} pending"),
            "a pending BIOS change applies at the next reboot",
        )),
        (Ok(current), _) => checks.push(Check::ok("boot-mode", current.to_string())),
        (Err(e), _) => checks.push(Check::warn(
            "boot-mode",
            e.to_string(),
            "check BIOS by hand",
        )),
    }
    if let IloClient::Redfish(redfish) = &client {
        redfish_checks(redfish, &mut checks).await;
    }
    // The Date header of the detection's answers, against the conductor's clock then.
    checks.push(match detected.clock {
        Some(clock) => clock_check(Some(clock.bmc), clock.local),
        None => clock_check(None, SystemTime::now()),
    });
    if let Some(url) = media_url {
        checks.push(media_check(&config, url).await);
    }
    if let IloClient::Redfish(redfish) = &client {
        redfish.logout().await;
    }
    report(checks, summary)
}

/// The fleet table of `ilo probe --inventory`: one row per iLO.
pub fn fleet_table(reports: &[Report]) -> String {
    let mut out = format!(
        "{:<24} {:<12} {:<8} {:>4} {:>4}  {}\n",
        "ADDRESS", "ILO", "PROTOCOL", "FAIL", "WARN", "FIRST FAILURE"
    );
    for r in reports {
        let (ilo, protocol) = match &r.detected {
            Some(d) => (
                format!(
                    "iLO {} {}",
                    d.generation.map_or_else(|| "?".into(), |g| g.to_string()),
                    d.firmware.as_deref().unwrap_or("?")
                ),
                d.protocol.clone(),
            ),
            None => ("-".to_string(), "-".to_string()),
        };
        let first = r
            .first_failure()
            .map(|c| format!("{}: {}", c.check, c.detail))
            .unwrap_or_else(|| "-".into());
        out.push_str(&format!(
            "{:<24} {:<12} {:<8} {:>4} {:>4}  {}\n",
            r.address,
            ilo,
            protocol,
            r.count(Status::Fail),
            r.count(Status::Warn),
            first
        ));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn old_firmware_lines_are_named() {
        let d = |generation, firmware: &str| Detected {
            generation,
            firmware: Some(firmware.into()),
            ..Detected::default()
        };
        assert_eq!(firmware_check(&d(Some(4), "2.10")).status, Status::Warn);
        assert_eq!(firmware_check(&d(Some(4), "2.80")).status, Status::Ok);
        assert_eq!(firmware_check(&d(Some(5), "1.15")).status, Status::Warn);
        assert_eq!(firmware_check(&d(Some(5), "2.72")).status, Status::Ok);
        assert_eq!(firmware_check(&d(Some(3), "1.90")).status, Status::Fail);
        assert_eq!(firmware_check(&d(None, "")).status, Status::Warn);
    }

    #[test]
    fn a_skewed_clock_is_named_either_way() {
        let now = SystemTime::UNIX_EPOCH + Duration::from_secs(1_800_000_000);
        let at = |s: i64| {
            if s >= 0 {
                now + Duration::from_secs(s as u64)
            } else {
                now - Duration::from_secs((-s) as u64)
            }
        };
        assert_eq!(clock_check(Some(at(5)), now).status, Status::Ok);
        let ahead = clock_check(Some(at(3600)), now);
        assert_eq!(ahead.status, Status::Warn);
        assert!(ahead.detail.contains("3600 s ahead"), "{}", ahead.detail);
        let behind = clock_check(Some(at(-600)), now);
        assert!(behind.detail.contains("600 s behind"), "{}", behind.detail);
        assert_eq!(clock_check(None, now).status, Status::Warn);
    }
}
