//! The kernel's device-to-driver table (`modules.alias`, written by `depmod`) and the matching
//! of device modaliases against it.
//!
//! # Format
//! One line per pattern: `alias <pattern> <module>`, the pattern a shell glob (`*`, `?`,
//! `[...]`) over the modalias a device shows in `/sys/bus/*/devices/*/modalias`. Comments start
//! with `#`. A PCI pattern has fixed fields, each a hex value or `*`
//! (`pci:v00008086d00001533sv*sd*bc*sc*i*`), in the order the kernel writes a PCI modalias:
//! `pci:v<vendor:8>d<device:8>sv<subvendor:8>sd<subdevice:8>bc<class:2>sc<subclass:2>i<if:2>`,
//! hex upper case. `modules.builtin.modinfo` lists the aliases of built-in drivers as
//! `<module>.alias=<pattern>` strings separated by NULs: [`AliasTable::add_builtin_modinfo`].
//!
//! # Who uses it
//! The image builder, to tell which driver drives each adapter a ProLiant may carry (its
//! coverage report), and the agent, to load the drivers of the devices present from the deploy
//! CD. Both read a table the kernel package made, but the agent reads it from a CD, so a line
//! that does not parse is an error, never a panic.

use std::fmt;

/// An error in a `modules.alias` file.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ModaliasError {
    /// A line that is neither blank, a comment nor `alias <pattern> <module>`.
    #[error("modules.alias line {line}: {reason}")]
    BadLine {
        /// 1-based line number.
        line: usize,
        /// What is wrong with it.
        reason: &'static str,
    },
}

/// One `alias` line.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Alias {
    /// The glob pattern.
    pub pattern: String,
    /// The module name, `-` written as `_` as kmod compares them.
    pub module: String,
    /// Whether the module is built into the kernel (from `modules.builtin.modinfo`).
    pub builtin: bool,
}

/// The parsed table, in file order (kmod loads matches in that order too).
#[derive(Debug, Clone, Default)]
pub struct AliasTable {
    aliases: Vec<Alias>,
}

/// A PCI function's ids, as `pci.ids` lists subsystems: no class.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct PciId {
    /// Vendor id.
    pub vendor: u16,
    /// Device id.
    pub device: u16,
    /// Subsystem vendor id.
    pub subvendor: u16,
    /// Subsystem device id.
    pub subdevice: u16,
}

impl fmt::Display for PciId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{:04x}:{:04x} {:04x}:{:04x}",
            self.vendor, self.device, self.subvendor, self.subdevice
        )
    }
}

/// The class part of a PCI pattern, after its `bc`, that matches every class: `*sc*i*` (the
/// kernel's file2alias writes each masked-out field as `*`).
const ANY_PCI_CLASS: &str = "*sc*i*";

impl AliasTable {
    /// Parses `modules.alias` text.
    pub fn parse(text: &str) -> Result<AliasTable, ModaliasError> {
        let mut table = AliasTable::default();
        for (n, line) in text.lines().enumerate() {
            let line = line.trim();
            if line.is_empty() || line.starts_with('#') {
                continue;
            }
            let bad = |reason| ModaliasError::BadLine {
                line: n + 1,
                reason,
            };
            let mut words = line.split_whitespace();
            if words.next() != Some("alias") {
                return Err(bad("does not start with `alias`"));
            }
            let pattern = words.next().ok_or_else(|| bad("no pattern"))?;
            let module = words.next().ok_or_else(|| bad("no module name"))?;
            if words.next().is_some() {
                return Err(bad("more than a pattern and a module"));
            }
            table.aliases.push(Alias {
                pattern: pattern.to_owned(),
                module: module.replace('-', "_"),
                builtin: false,
            });
        }
        Ok(table)
    }

    /// Adds the aliases of built-in drivers from `modules.builtin.modinfo` (NUL-separated
    /// `module.key=value` strings; only `alias` keys are read, anything else is skipped).
    pub fn add_builtin_modinfo(&mut self, modinfo: &[u8]) {
        for entry in modinfo.split(|&b| b == 0) {
            let Ok(entry) = std::str::from_utf8(entry) else {
                continue;
            };
            let Some((module, pattern)) = entry.split_once(".alias=") else {
                continue;
            };
            if module.is_empty() || pattern.is_empty() || module.contains('=') {
                continue;
            }
            self.aliases.push(Alias {
                pattern: pattern.to_owned(),
                module: module.replace('-', "_"),
                builtin: true,
            });
        }
    }

    /// Adds an alias after the others.
    pub fn push(&mut self, alias: Alias) {
        self.aliases.push(alias);
    }

    /// Every alias line, in file order.
    pub fn aliases(&self) -> &[Alias] {
        &self.aliases
    }

    /// The aliases whose pattern matches a device's modalias, in table order.
    pub fn matching<'a>(&'a self, modalias: &'a str) -> impl Iterator<Item = &'a Alias> + 'a {
        self.aliases
            .iter()
            .filter(move |a| glob_match(a.pattern.as_bytes(), modalias.as_bytes()))
    }

    /// The aliases that match a PCI function whatever its class: those whose pattern names
    /// the ids (or leaves them open) and leaves the class open. A pattern that fixes a class
    /// (`nvme`'s `bc01sc08i02`, `xhci_pci`'s `bc0Csc03i30`) is not taken: `pci.ids` lists no
    /// class per subsystem, so whether it matches cannot be told from the ids alone.
    pub fn matching_pci_ids(&self, id: PciId) -> impl Iterator<Item = &Alias> + '_ {
        let ids = format!(
            "pci:v{:08X}d{:08X}sv{:08X}sd{:08X}",
            id.vendor, id.device, id.subvendor, id.subdevice
        );
        self.aliases.iter().filter(move |a| {
            let Some((head, class)) = a.pattern.rsplit_once("bc") else {
                return false;
            };
            class == ANY_PCI_CLASS && glob_match(head.as_bytes(), ids.as_bytes())
        })
    }
}

/// Shell-style glob matching as kmod does it with `fnmatch(3)` without flags: `*` any run of
/// bytes, `?` one byte, `[abc]`, `[a-z]` and `[!a]`/`[^a]` one byte of (or not of) a set; any
/// other byte itself. An unclosed `[` matches itself. Linear in practice: one backtrack point,
/// the last `*`.
pub fn glob_match(pattern: &[u8], text: &[u8]) -> bool {
    let (mut p, mut t) = (0, 0);
    // Where to resume after the last `*`: the pattern just past it, and the text it swallowed.
    let mut star: Option<(usize, usize)> = None;
    while t < text.len() {
        match pattern.get(p) {
            Some(b'*') => {
                star = Some((p + 1, t));
                p += 1;
                continue;
            }
            Some(b'?') => {
                p += 1;
                t += 1;
                continue;
            }
            Some(b'[') => {
                if let Some((matched, next)) = bracket(pattern, p, text[t]) {
                    if matched {
                        p = next;
                        t += 1;
                        continue;
                    }
                } else if text[t] == b'[' {
                    p += 1;
                    t += 1;
                    continue;
                }
            }
            Some(&c) if c == text[t] => {
                p += 1;
                t += 1;
                continue;
            }
            _ => {}
        }
        match star {
            Some((after, swallowed)) => {
                p = after;
                t = swallowed + 1;
                star = Some((after, swallowed + 1));
            }
            None => return false,
        }
    }
    pattern[p.min(pattern.len())..].iter().all(|&c| c == b'*')
}

/// Matches one byte against the bracket expression at `pattern[open]` (a `[`): whether it
/// matched and where the pattern goes on, or `None` when the bracket is not closed.
fn bracket(pattern: &[u8], open: usize, byte: u8) -> Option<(bool, usize)> {
    let mut i = open + 1;
    let negate = matches!(pattern.get(i), Some(b'!' | b'^'));
    if negate {
        i += 1;
    }
    let mut matched = false;
    let mut first = true;
    loop {
        let c = *pattern.get(i)?;
        if c == b']' && !first {
            return Some((matched != negate, i + 1));
        }
        first = false;
        if pattern.get(i + 1) == Some(&b'-') && pattern.get(i + 2).is_some_and(|&e| e != b']') {
            let end = pattern[i + 2];
            matched |= (c..=end).contains(&byte);
            i += 3;
        } else {
            matched |= c == byte;
            i += 1;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    const SAMPLE: &str = "# Aliases extracted from modules themselves.\n\
        alias pci:v00008086d00001533sv*sd*bc*sc*i* igb\n\
        alias pci:v00001000d00000073sv*sd*bc*sc*i* megaraid_sas\n\
        alias pci:v*d*sv*sd*bc01sc08i02* nvme\n\
        alias pci:v000014E4d0000168Esv0000103Csd*bc*sc*i* bnx2x\n\
        alias usb:v*p*d*dc*dsc*dp*ic08isc06ip50in* usb-storage\n";

    #[test]
    fn parses_the_kernels_lines_and_names_modules_as_kmod_does() {
        let table = AliasTable::parse(SAMPLE).expect("parses");
        assert_eq!(table.aliases().len(), 5);
        assert_eq!(table.aliases()[4].module, "usb_storage");
        for bad in ["alias onlypattern", "options igb x=1", "alias a b c"] {
            let err = AliasTable::parse(bad).expect_err(bad);
            assert!(
                matches!(err, ModaliasError::BadLine { line: 1, .. }),
                "{err}"
            );
        }
    }

    #[test]
    fn a_device_modalias_finds_its_drivers() {
        let table = AliasTable::parse(SAMPLE).expect("parses");
        let names =
            |m: &str| -> Vec<String> { table.matching(m).map(|a| a.module.clone()).collect() };
        assert_eq!(
            names("pci:v00008086d00001533sv0000103Csd00000003bc02sc00i00"),
            ["igb"]
        );
        assert_eq!(
            names("pci:v0000144Dd0000A808sv0000144Dsd0000A801bc01sc08i02"),
            ["nvme"]
        );
        assert!(names("pci:v00008086d00001534sv00000000sd00000000bc02sc00i00").is_empty());
        assert_eq!(
            names("usb:v03F0p0001d0100dc00dsc00dp00ic08isc06ip50in00"),
            ["usb_storage"]
        );
    }

    #[test]
    fn ids_alone_match_only_patterns_that_leave_the_class_open() {
        let table = AliasTable::parse(SAMPLE).expect("parses");
        let hp_534flr = PciId {
            vendor: 0x14e4,
            device: 0x168e,
            subvendor: 0x103c,
            subdevice: 0x1930,
        };
        let names: Vec<_> = table
            .matching_pci_ids(hp_534flr)
            .map(|a| &a.module)
            .collect();
        assert_eq!(names, ["bnx2x"]);
        let other_subvendor = PciId {
            subvendor: 0x1590,
            ..hp_534flr
        };
        assert_eq!(table.matching_pci_ids(other_subvendor).count(), 0);
        let nvme_drive = PciId {
            vendor: 0x144d,
            device: 0xa808,
            subvendor: 0x1590,
            subdevice: 0x0001,
        };
        assert_eq!(table.matching_pci_ids(nvme_drive).count(), 0, "class-only");
    }

    #[test]
    fn builtin_modinfo_adds_aliases_and_skips_the_rest() {
        let mut table = AliasTable::default();
        table.add_builtin_modinfo(
            b"ahci.license=GPL\0ahci.alias=pci:v*d*sv*sd*bc01sc06i01*\0\xff\xfe\0.alias=x\0crc-t10dif.alias=crypto-crct10dif\0",
        );
        let modules: Vec<_> = table.aliases().iter().map(|a| a.module.as_str()).collect();
        assert_eq!(modules, ["ahci", "crc_t10dif"]);
        assert!(table.aliases().iter().all(|a| a.builtin));
    }

    #[test]
    fn globs_follow_fnmatch() {
        let cases: &[(&str, &str, bool)] = &[
            ("a*c", "abbbc", true),
            ("a*c", "abbbd", false),
            ("*", "", true),
            ("", "", true),
            ("", "a", false),
            ("a?c", "abc", true),
            ("a?c", "ac", false),
            ("[ab]x", "bx", true),
            ("[!ab]x", "bx", false),
            ("[^ab]x", "cx", true),
            ("[a-f]1", "e1", true),
            ("[a-f]1", "g1", false),
            ("[]]", "]", true),
            ("[a-]", "-", true),
            ("[abc", "[abc", true),
            ("*bc*sc*i*", "pci:bc02sc00i00", true),
            ("a*b*c", "aXbYbZc", true),
            ("a*b*c", "aXbYbZ", false),
        ];
        for &(pattern, text, expected) in cases {
            assert_eq!(
                glob_match(pattern.as_bytes(), text.as_bytes()),
                expected,
                "{pattern:?} against {text:?}"
            );
        }
    }

    /// A reference matcher: plain recursion over `*` and `?` (the two the kernel writes).
    fn reference(p: &[u8], t: &[u8]) -> bool {
        match (p.first(), t.first()) {
            (None, None) => true,
            (Some(b'*'), _) => reference(&p[1..], t) || (!t.is_empty() && reference(p, &t[1..])),
            (Some(b'?'), Some(_)) => reference(&p[1..], &t[1..]),
            (Some(a), Some(b)) if a == b => reference(&p[1..], &t[1..]),
            _ => false,
        }
    }

    proptest! {
        #[test]
        fn star_and_question_agree_with_a_reference(
            p in "[ab*?]{0,8}",
            t in "[ab]{0,10}",
        ) {
            prop_assert_eq!(glob_match(p.as_bytes(), t.as_bytes()), reference(p.as_bytes(), t.as_bytes()));
        }

        #[test]
        fn arbitrary_tables_and_modaliases_never_panic(
            text in "(alias [a-z*?\\[\\]!^-]{0,12} [a-z-]{0,6}\n|[^\n]{0,20}\n){0,8}",
            modalias in "[a-z*?\\[\\]!^-]{0,16}",
            modinfo in proptest::collection::vec(any::<u8>(), 0..64),
        ) {
            if let Ok(mut table) = AliasTable::parse(&text) {
                table.add_builtin_modinfo(&modinfo);
                let _ = table.matching(&modalias).count();
                let _ = table.matching_pci_ids(PciId { vendor: 1, device: 2, subvendor: 3, subdevice: 4 }).count();
            }
            let _ = glob_match(modalias.as_bytes(), text.as_bytes());
        }
    }
}
