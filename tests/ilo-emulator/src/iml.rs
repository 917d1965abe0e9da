//! The Integrated Management Log (IML): the server firmware's own record of POST and boot
//! events, which an iLO keeps and serves (Redfish `Systems/1/LogServices/IML/Entries`).
//!
//! # What the emulator records
//! A real ProLiant's UEFI firmware logs a Secure Boot refusal there. The emulator cannot run
//! HPE's firmware, so it reads what OVMF prints on the serial console when its boot manager
//! refuses an image, and records it as a critical entry:
//! ```text
//! BdsDxe: failed to load Boot0001 "UEFI QEMU DVD-ROM QM00005 " from PciRoot(0x0)/...: Access Denied
//! BdsDxe: failed to start Boot0002 "EFI Internal Shell" from Fv(...)/FvFile(...): Security Violation
//! ```
//! The entry's shape (`Severity`, `Message`, `Created`, `Oem.Hpe.Class`/`Code`) is the
//! iLO's. HPE does not publish the wording of its Secure Boot entry. The message therefore says
//! what happened in our words and quotes the firmware's status. A client must match on
//! severity and time, never on the text.
//!
//! The console is scanned from where the last scan stopped ([`Iml::scan`]); a line cut by the
//! end of what was read waits for its end.

use serde_json::{json, Value};

/// IML class of the entries recorded here. HPE's class numbers are not published for this
/// event; 0x21 is the emulator's own ("UEFI POST").
pub const CLASS_UEFI_POST: u32 = 0x21;
/// Code of a refused image within [`CLASS_UEFI_POST`] (the emulator's own).
pub const CODE_IMAGE_REFUSED: u32 = 0x1;
/// The most entries kept; the oldest go first, as on an iLO whose log is full.
pub const MAX_ENTRIES: usize = 256;

/// One IML entry.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ImlEntry {
    /// Sequence number from 1, never reused.
    pub id: u64,
    /// When it was recorded, RFC 3339 UTC (`2026-12-07T12:00:00Z`).
    pub created: String,
    /// `OK`, `Warning` or `Critical`.
    pub severity: &'static str,
    /// What happened.
    pub message: String,
}

impl ImlEntry {
    /// The Redfish `LogEntry` an iLO 5/6 serves for it.
    pub fn to_redfish(&self) -> Value {
        json!({
            "@odata.id": format!("/redfish/v1/Systems/1/LogServices/IML/Entries/{}/", self.id),
            "@odata.type": "#LogEntry.v1_0_0.LogEntry",
            "Id": self.id.to_string(),
            "Name": "Integrated Management Log",
            "Created": self.created,
            "EntryType": "Oem",
            "OemRecordFormat": "Hpe-IML",
            "Severity": self.severity,
            "Message": self.message,
            "Oem": {"Hpe": {
                "Class": CLASS_UEFI_POST,
                "Code": CODE_IMAGE_REFUSED,
                "Count": 1,
                "Updated": self.created,
                "Repaired": false,
            }},
        })
    }
}

/// The log and how far the console has been read.
#[derive(Debug, Default)]
pub struct Iml {
    entries: Vec<ImlEntry>,
    next_id: u64,
    /// Bytes of the console read so far.
    pub scanned: u64,
    /// The start of a line whose end has not been read yet.
    partial: String,
}

impl Iml {
    /// The entries, oldest first.
    pub fn entries(&self) -> &[ImlEntry] {
        &self.entries
    }

    /// Adds an entry made now.
    pub fn record(&mut self, severity: &'static str, message: String, created: String) {
        self.next_id += 1;
        self.entries.push(ImlEntry {
            id: self.next_id,
            created,
            severity,
            message,
        });
        if self.entries.len() > MAX_ENTRIES {
            self.entries.remove(0);
        }
    }

    /// Reads `text`, the console bytes after [`Self::scanned`], and records each refusal in it
    /// at `created`. Returns how many it recorded.
    pub fn scan(&mut self, text: &[u8], created: &str) -> usize {
        self.scanned += text.len() as u64;
        let mut joined = std::mem::take(&mut self.partial);
        joined.push_str(&String::from_utf8_lossy(text));
        let mut lines: Vec<&str> = joined.split(['\n', '\r']).collect();
        let rest = lines.pop().unwrap_or_default().to_owned();
        let mut recorded = 0;
        for line in lines {
            if let Some(message) = refusal(line) {
                self.record("Critical", message, created.to_owned());
                recorded += 1;
            }
        }
        // A line of a console gone wild must not grow without bound.
        self.partial = rest
            .chars()
            .rev()
            .take(4096)
            .collect::<Vec<_>>()
            .into_iter()
            .rev()
            .collect();
        recorded
    }
}

/// The entry's message for an OVMF boot-manager line that reports a refused image, if `line` is
/// one.
pub fn refusal(line: &str) -> Option<String> {
    // Escape sequences of the firmware's screen handling may precede the text.
    let at = line.find("BdsDxe: failed to ")?;
    let line = &line[at..];
    let (_, status) = line.rsplit_once(": ")?;
    let status = status.trim();
    if status != "Access Denied" && status != "Security Violation" {
        return None;
    }
    let option = line
        .split('"')
        .nth(1)
        .map(str::trim)
        .filter(|o| !o.is_empty())
        .unwrap_or("a boot option");
    Some(format!(
        "Secure Boot violation: the UEFI firmware refused to run the boot image of \"{option}\" \
         ({status}): its signature is not trusted by the Secure Boot keys"
    ))
}

/// `epoch` seconds as RFC 3339 UTC.
pub fn rfc3339(epoch: std::time::SystemTime) -> String {
    let secs = epoch
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0);
    let secs = i64::try_from(secs).unwrap_or(0);
    time::OffsetDateTime::from_unix_timestamp(secs)
        .ok()
        .and_then(|t| {
            t.format(&time::format_description::well_known::Rfc3339)
                .ok()
        })
        .unwrap_or_else(|| "1970-01-01T00:00:00Z".to_owned())
}

#[cfg(test)]
mod tests {
    use super::*;

    const DENIED: &str = "\x1b[2J\x1b[01;01HBdsDxe: failed to load Boot0001 \"UEFI QEMU DVD-ROM \
                          QM00005 \" from PciRoot(0x0)/Pci(0x1F,0x2)/Sata(0x2,0xFFFF,0x0): \
                          Access Denied";

    #[test]
    fn ovmf_refusals_are_recognised_and_other_lines_not() {
        let m = refusal(DENIED).expect("a refusal");
        assert!(m.contains("\"UEFI QEMU DVD-ROM QM00005\""), "{m}");
        assert!(m.contains("(Access Denied)"), "{m}");
        assert!(refusal(
            "BdsDxe: failed to start Boot0002 \"EFI Internal Shell\" from Fv(7CB8)/FvFile(7C04): \
             Security Violation"
        )
        .is_some());
        for other in [
            "BdsDxe: failed to load Boot0001 \"UEFI QEMU DVD-ROM\" from PciRoot(0x0): Not Found",
            "BdsDxe: loading Boot0001 \"UEFI QEMU DVD-ROM\" from PciRoot(0x0)",
            "Access Denied",
            "",
        ] {
            assert_eq!(refusal(other), None, "{other:?}");
        }
    }

    #[test]
    fn a_line_split_across_scans_is_recorded_once() {
        let mut iml = Iml::default();
        let text = format!("boot\r\n{DENIED}\r\nmore");
        let (a, b) = text.as_bytes().split_at(40);
        assert_eq!(iml.scan(a, "2026-12-07T12:00:00Z"), 0);
        assert_eq!(iml.scan(b, "2026-12-07T12:00:01Z"), 1);
        assert_eq!(iml.scan(b"\n", "2026-12-07T12:00:02Z"), 0);
        assert_eq!(iml.scanned, text.len() as u64 + 1);
        let e = &iml.entries()[0];
        assert_eq!((e.id, e.severity), (1, "Critical"));
        assert_eq!(e.created, "2026-12-07T12:00:01Z");
        let v = e.to_redfish();
        assert_eq!(v["Severity"], "Critical");
        assert_eq!(v["Oem"]["Hpe"]["Class"], CLASS_UEFI_POST);
        assert_eq!(v["Id"], "1");
    }

    #[test]
    fn the_log_keeps_the_newest_entries() {
        let mut iml = Iml::default();
        for i in 0..MAX_ENTRIES + 5 {
            iml.record("OK", format!("{i}"), "t".into());
        }
        assert_eq!(iml.entries().len(), MAX_ENTRIES);
        assert_eq!(iml.entries()[0].id, 6);
    }

    #[test]
    fn rfc3339_of_a_known_time() {
        let t = std::time::UNIX_EPOCH + std::time::Duration::from_secs(1_796_645_876);
        assert_eq!(rfc3339(t), "2026-12-07T12:17:56Z");
    }
}
