//! The PCI ID repository's `pci.ids` (Debian's `pci.ids` package,
//! `/usr/share/misc/pci.ids`): the subsystems a vendor registered under other vendors' chips.
//!
//! # Format
//! ```text
//! # comment
//! 14e4  Broadcom Inc. and subsidiaries                vendor: 4 hex digits, 2 spaces, name
//! \t168e  NetXtreme II BCM57810 10 Gigabit Ethernet     device: a tab
//! \t\t103c 1930  FlexFabric 10Gb 2-port 534FLR-SFP+     subsystem: two tabs, subvendor subdevice
//! C 02  Network controller                            classes from here on: not read
//! ```
//! The subsystem's subvendor is the board's maker: HP's and HPE's adapters are the subsystems
//! with subvendor `103c` (Hewlett-Packard) or `1590` (Hewlett Packard Enterprise) on other
//! makers' chips.

use anyhow::{bail, Context};
use vmdeploy_shared::modalias::PciId;

/// One subsystem entry with its names.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Subsystem {
    /// The four ids.
    pub id: PciId,
    /// The chip's vendor and device names, and the subsystem's own name.
    pub vendor_name: String,
    /// The chip's name.
    pub device_name: String,
    /// The board's name (`FlexFabric 10Gb 2-port 534FLR-SFP+ Adapter`).
    pub name: String,
}

/// The file's version line (`# Version: 2023.04.11`), when it has one.
pub fn version(text: &str) -> Option<&str> {
    text.lines()
        .take_while(|l| l.starts_with('#') || l.is_empty())
        .find_map(|l| {
            l.strip_prefix("#\tVersion:")
                .or(l.strip_prefix("# Version:"))
        })
        .map(str::trim)
}

fn hex4(word: &str) -> Option<u16> {
    (word.len() == 4)
        .then(|| u16::from_str_radix(word, 16).ok())
        .flatten()
}

/// `ID  name` (the ID 4 hex digits) from a vendor or device line.
fn id_and_name(line: &str) -> Option<(u16, &str)> {
    let (id, name) = line.split_once(' ')?;
    Some((hex4(id)?, name.trim()))
}

/// Every subsystem whose subvendor is one of `subvendors`, in file order. A line that does not
/// parse is an error with its number: the file comes from a package, and a bad one should be
/// noticed, not half read.
pub fn subsystems_of(text: &str, subvendors: &[u16]) -> anyhow::Result<Vec<Subsystem>> {
    let mut found = Vec::new();
    let mut vendor: Option<(u16, &str)> = None;
    let mut device: Option<(u16, &str)> = None;
    for (n, raw) in text.lines().enumerate() {
        let line_no = n + 1;
        if raw.trim().is_empty() || raw.starts_with('#') {
            continue;
        }
        if raw.starts_with("C ") {
            // The class list ends the device list.
            break;
        }
        if let Some(sub) = raw.strip_prefix("\t\t") {
            let (vendor_id, vendor_name) = vendor
                .with_context(|| format!("pci.ids line {line_no}: subsystem before a vendor"))?;
            let (device_id, device_name) = device
                .with_context(|| format!("pci.ids line {line_no}: subsystem before a device"))?;
            let mut words = sub.splitn(3, ' ');
            let (Some(sv), Some(sd), Some(name)) = (
                words.next().and_then(hex4),
                words.next().and_then(hex4),
                words.next(),
            ) else {
                bail!("pci.ids line {line_no}: not `SUBVENDOR SUBDEVICE  name`: {sub:?}");
            };
            if subvendors.contains(&sv) {
                found.push(Subsystem {
                    id: PciId {
                        vendor: vendor_id,
                        device: device_id,
                        subvendor: sv,
                        subdevice: sd,
                    },
                    vendor_name: vendor_name.to_owned(),
                    device_name: device_name.to_owned(),
                    name: name.trim().to_owned(),
                });
            }
        } else if let Some(dev) = raw.strip_prefix('\t') {
            if vendor.is_none() {
                bail!("pci.ids line {line_no}: device before a vendor");
            }
            device = Some(
                id_and_name(dev)
                    .with_context(|| format!("pci.ids line {line_no}: not `DEVICE  name`"))?,
            );
        } else {
            vendor = Some(
                id_and_name(raw)
                    .with_context(|| format!("pci.ids line {line_no}: not `VENDOR  name`"))?,
            );
            device = None;
        }
    }
    Ok(found)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    const SAMPLE: &str = "#\n#\tList of PCI ID's\n#\n#\tVersion: 2023.04.11\n#\n\n\
        14e4  Broadcom Inc. and subsidiaries\n\
        \t168e  NetXtreme II BCM57810 10 Gigabit Ethernet\n\
        \t\t103c 1930  FlexFabric 10Gb 2-port 534FLR-SFP+ Adapter\n\
        \t\t1028 1006  PowerEdge 57810\n\
        # a comment between entries\n\
        8086  Intel Corporation\n\
        \t1521  I350 Gigabit Network Connection\n\
        \t\t1590 00cb  Ethernet 1Gb 4-port 366FLR Adapter\n\
        \t1533  I210 Gigabit Network Connection\n\
        C 02  Network controller\n\
        \t00  Ethernet controller\n";

    #[test]
    fn reads_the_hp_and_hpe_subsystems_with_their_names() {
        let found = subsystems_of(SAMPLE, &[0x103c, 0x1590]).expect("parses");
        assert_eq!(found.len(), 2);
        assert_eq!(
            found[0].id,
            PciId {
                vendor: 0x14e4,
                device: 0x168e,
                subvendor: 0x103c,
                subdevice: 0x1930
            }
        );
        assert_eq!(found[0].name, "FlexFabric 10Gb 2-port 534FLR-SFP+ Adapter");
        assert_eq!(found[1].device_name, "I350 Gigabit Network Connection");
        assert_eq!(found[1].vendor_name, "Intel Corporation");
        assert_eq!(version(SAMPLE), Some("2023.04.11"));
    }

    #[test]
    fn malformed_lines_are_errors_with_their_number() {
        for (text, line) in [
            ("\t1533  x\n", 1),
            ("8086  Intel\n\t\t1590 00cb  x\n", 2),
            ("8086  Intel\n\tzz  x\n", 2),
            ("8086  Intel\n\t1533  x\n\t\t1590  x\n", 3),
            ("808  Intel\n", 1),
        ] {
            let err = subsystems_of(text, &[0x1590]).expect_err(text);
            assert!(
                format!("{err:#}").contains(&format!("line {line}")),
                "{text:?}: {err:#}"
            );
        }
    }

    proptest! {
        #[test]
        fn arbitrary_text_never_panics(text in "([0-9a-fC #\t]{0,12}( [^\n]{0,8})?\n){0,12}") {
            let _ = subsystems_of(&text, &[0x103c]);
            let _ = version(&text);
        }
    }
}
