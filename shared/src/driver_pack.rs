//! The deploy CD's driver pack: the kernel modules and firmware files that are not in the
//! initramfs, and the index the agent reads to load, for the devices a node has, only what they
//! need (docs/deploy-media.md, "On-demand loading").
//!
//! # On the CD
//! ```text
//! /DRIVERS/INDEX.      this index
//! /DRIVERS/M0001.XZ    one module, xz-compressed, byte for byte the kernel package's file
//! /DRIVERS/F0001.XZ    one firmware file, xz-compressed
//! ```
//! ISO 9660 names are upper-case d-characters, so the files carry generated names and the index
//! says which is which. Each file is its own xz stream: the agent reads just the files it loads,
//! and a module's appended signature survives (the kernel checks it on the decompressed bytes).
//!
//! # Index format (text, one record per line)
//! ```text
//! vmdeploy-driver-pack 1
//! kernel 6.1.0-57-amd64
//! module igb M0003.XZ 472312 dca,i2c_algo_bit -
//! module bnx2x M0009.XZ 1716600 mdio,libcrc32c bnx2x/bnx2x-e1-7.13.21.0.fw,bnx2x/bnx2x-e2-7.13.21.0.fw
//! firmware bnx2x/bnx2x-e1-7.13.21.0.fw F0001.XZ 273864
//! alias pci:v00008086d000010C9sv*sd*bc*sc*i* igb
//! ```
//! - `module <name> <file> <bytes> <deps> <firmware>`: `name` in kmod's form (`_`, not `-`);
//!   `bytes` the decompressed size; `deps` every module to load first, in load order (the
//!   transitive closure from `modules.dep`, deepest first), or `-`; `firmware` the firmware files
//!   the module names that the pack carries, or `-`.
//! - `firmware <name> <file> <bytes>`: `name` as the kernel asks for it under `/lib/firmware`.
//! - `alias <pattern> <module>`: `modules.alias` lines of the pack's modules, in the kernel
//!   package's order ([`crate::modalias`]).
//! - Blank lines and lines starting with `#` are skipped.
//!
//! Every name a line refers to must be declared by its own line (order free); a module's
//! dependencies must not name it. The agent reads this from a CD, so every rule is checked and
//! a broken index is an error that names the line, never a panic.

use std::collections::BTreeMap;
use std::fmt::Write as _;

use crate::modalias::{Alias, AliasTable};

/// The first line of every index.
pub const MAGIC: &str = "vmdeploy-driver-pack 1";
/// The pack's directory on the CD.
pub const DIR: &str = "DRIVERS";
/// The index's ISO 9660 name in [`DIR`].
pub const INDEX_NAME: &str = "INDEX.";
/// Where a network-boot ramdisk carries the pack (index and files under the same names), for a
/// boot with no CD to read it from.
pub const INITRAMFS_DIR: &str = "usr/lib/vmdeploy/drivers";
/// Largest index accepted.
pub const MAX_INDEX_BYTES: u64 = 8 << 20;
/// Largest decompressed module or firmware file accepted (the largest Debian 6.1 network or
/// storage module, mlx5_core, is 3.9 MB; the largest firmware file about 5 MB).
pub const MAX_FILE_BYTES: u64 = 64 << 20;
/// Most modules or firmware files an index may declare.
const MAX_ENTRIES: usize = 20_000;
/// Longest line accepted.
const MAX_LINE: usize = 16 << 10;

/// A module of the pack.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PackModule {
    /// kmod's name (`_` for `-`).
    pub name: String,
    /// Its file's name in [`DIR`].
    pub file: String,
    /// Decompressed size.
    pub bytes: u64,
    /// Modules to load first, in order.
    pub deps: Vec<String>,
    /// Firmware files it needs that the pack carries.
    pub firmware: Vec<String>,
}

/// A firmware file of the pack.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PackFirmware {
    /// Path under `/lib/firmware`.
    pub name: String,
    /// Its file's name in [`DIR`].
    pub file: String,
    /// Decompressed size.
    pub bytes: u64,
}

/// The parsed index.
#[derive(Debug, Clone, Default)]
pub struct DriverPack {
    /// The kernel release the modules were built for (`uname -r`).
    pub kernel: String,
    modules: BTreeMap<String, PackModule>,
    firmware: BTreeMap<String, PackFirmware>,
    aliases: AliasTable,
}

/// Why an index could not be read.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DriverPackError {
    /// A line breaks the format.
    #[error("driver pack index line {line}: {reason}")]
    BadLine {
        /// 1-based line number.
        line: usize,
        /// What is wrong.
        reason: String,
    },
    /// A name is referred to but never declared, or the index as a whole is wrong.
    #[error("driver pack index: {0}")]
    Inconsistent(String),
}

impl DriverPack {
    /// An empty pack for `kernel`, to fill with [`DriverPack::add_module`] and friends.
    pub fn new(kernel: &str) -> DriverPack {
        DriverPack {
            kernel: kernel.to_owned(),
            ..DriverPack::default()
        }
    }

    /// Parses an index (format in the module docs).
    pub fn parse(text: &str) -> Result<DriverPack, DriverPackError> {
        let mut pack = DriverPack::default();
        let mut alias_lines = String::new();
        let mut seen_magic = false;
        let mut kernel = None;
        for (n, raw) in text.lines().enumerate() {
            let line = n + 1;
            let bad = |reason: &str| DriverPackError::BadLine {
                line,
                reason: reason.to_owned(),
            };
            if raw.len() > MAX_LINE {
                return Err(bad("longer than 16 KiB"));
            }
            let trimmed = raw.trim();
            if trimmed.is_empty() || trimmed.starts_with('#') {
                continue;
            }
            if !seen_magic {
                if trimmed != MAGIC {
                    return Err(bad(&format!("the first record must be `{MAGIC}`")));
                }
                seen_magic = true;
                continue;
            }
            let words: Vec<&str> = trimmed.split_whitespace().collect();
            match words.as_slice() {
                ["kernel", release] => {
                    if kernel.replace(*release).is_some() {
                        return Err(bad("a second `kernel` record"));
                    }
                    check_name(release, false).map_err(|r| bad(&format!("kernel: {r}")))?;
                }
                ["module", name, file, bytes, deps, firmware] => {
                    let module = PackModule {
                        name: module_name(name).map_err(|r| bad(&r))?,
                        file: iso_file_name(file).map_err(|r| bad(&r))?,
                        bytes: size(bytes).map_err(|r| bad(&r))?,
                        deps: list(deps)
                            .map(module_name)
                            .collect::<Result<_, _>>()
                            .map_err(|r| bad(&r))?,
                        firmware: list(firmware)
                            .map(firmware_name)
                            .collect::<Result<_, _>>()
                            .map_err(|r| bad(&r))?,
                    };
                    if module.deps.contains(&module.name) {
                        return Err(bad("a module cannot depend on itself"));
                    }
                    pack.insert_module(module).map_err(|r| bad(&r))?;
                }
                ["firmware", name, file, bytes] => {
                    let fw = PackFirmware {
                        name: firmware_name(name).map_err(|r| bad(&r))?,
                        file: iso_file_name(file).map_err(|r| bad(&r))?,
                        bytes: size(bytes).map_err(|r| bad(&r))?,
                    };
                    pack.insert_firmware(fw).map_err(|r| bad(&r))?;
                }
                ["alias", pattern, module] => {
                    module_name(module).map_err(|r| bad(&r))?;
                    if pattern.is_empty() {
                        return Err(bad("an empty alias pattern"));
                    }
                    // AliasTable numbers its own lines; they are ours, in order, so its
                    // errors cannot happen once the words are checked here.
                    let _ = writeln!(alias_lines, "alias {pattern} {module}");
                }
                [kind, ..] => {
                    return Err(bad(&format!(
                        "`{kind}` with {} words is not a record",
                        words.len()
                    )))
                }
                [] => {}
            }
        }
        if !seen_magic {
            return Err(DriverPackError::Inconsistent(format!(
                "empty: no `{MAGIC}` record"
            )));
        }
        pack.kernel = kernel
            .ok_or_else(|| DriverPackError::Inconsistent("no `kernel` record".into()))?
            .to_owned();
        pack.aliases = AliasTable::parse(&alias_lines)
            .map_err(|e| DriverPackError::Inconsistent(format!("aliases: {e}")))?;
        pack.check_references()
            .map_err(DriverPackError::Inconsistent)?;
        Ok(pack)
    }

    /// Adds a module; a name, file or size the index could not carry, or a second module of
    /// the same name, is an error (what is added always parses back).
    pub fn add_module(&mut self, module: PackModule) -> Result<(), DriverPackError> {
        let checked = (|| {
            let name = module_name(&module.name)?;
            iso_file_name(&module.file)?;
            check_size(module.bytes)?;
            let deps = module
                .deps
                .iter()
                .map(|d| module_name(d))
                .collect::<Result<Vec<_>, _>>()?;
            if deps.contains(&name) {
                return Err(format!("module {name} depends on itself"));
            }
            for f in &module.firmware {
                firmware_name(f)?;
            }
            Ok(PackModule {
                name,
                deps,
                ..module
            })
        })();
        checked
            .and_then(|m| self.insert_module(m))
            .map_err(DriverPackError::Inconsistent)
    }

    /// Adds a firmware file; a name, file or size the index could not carry, or a second file
    /// of the same name, is an error.
    pub fn add_firmware(&mut self, fw: PackFirmware) -> Result<(), DriverPackError> {
        firmware_name(&fw.name)
            .and_then(|_| iso_file_name(&fw.file))
            .and_then(|_| check_size(fw.bytes))
            .and_then(|_| self.insert_firmware(fw))
            .map_err(DriverPackError::Inconsistent)
    }

    /// Adds an alias line (`pattern` → `module`).
    pub fn add_alias(&mut self, pattern: &str, module: &str) -> Result<(), DriverPackError> {
        if pattern.is_empty() || pattern.len() > 1024 || pattern.contains(char::is_whitespace) {
            return Err(DriverPackError::Inconsistent(format!(
                "alias pattern {pattern:?}: empty, too long or with white space"
            )));
        }
        let module = module_name(module).map_err(DriverPackError::Inconsistent)?;
        self.aliases.push(Alias {
            pattern: pattern.to_owned(),
            module,
            builtin: false,
        });
        Ok(())
    }

    /// The index text; [`DriverPack::parse`] reads it back to an equal pack. Fails when a
    /// name is referred to but not declared.
    pub fn render(&self) -> Result<String, DriverPackError> {
        self.check_references()
            .map_err(DriverPackError::Inconsistent)?;
        let mut out = String::new();
        let _ = writeln!(out, "{MAGIC}");
        let _ = writeln!(out, "kernel {}", self.kernel);
        for m in self.modules.values() {
            let _ = writeln!(
                out,
                "module {} {} {} {} {}",
                m.name,
                m.file,
                m.bytes,
                join(&m.deps),
                join(&m.firmware)
            );
        }
        for f in self.firmware.values() {
            let _ = writeln!(out, "firmware {} {} {}", f.name, f.file, f.bytes);
        }
        for a in self.aliases.aliases() {
            let _ = writeln!(out, "alias {} {}", a.pattern, a.module);
        }
        Ok(out)
    }

    /// A module by name (`-` or `_` alike).
    pub fn module(&self, name: &str) -> Option<&PackModule> {
        self.modules.get(&name.replace('-', "_"))
    }

    /// A firmware file by name.
    pub fn firmware(&self, name: &str) -> Option<&PackFirmware> {
        self.firmware.get(name)
    }

    /// Every module, by name.
    pub fn modules(&self) -> impl Iterator<Item = &PackModule> {
        self.modules.values()
    }

    /// Every firmware file, by name.
    pub fn firmware_files(&self) -> impl Iterator<Item = &PackFirmware> {
        self.firmware.values()
    }

    /// The pack's modules whose aliases match a device's modalias, in index order, each once.
    pub fn modules_for(&self, modalias: &str) -> Vec<&PackModule> {
        let mut found: Vec<&PackModule> = Vec::new();
        for alias in self.aliases.matching(modalias) {
            if let Some(m) = self.modules.get(&alias.module) {
                if !found.iter().any(|f| f.name == m.name) {
                    found.push(m);
                }
            }
        }
        found
    }

    /// What loading `module` takes, in order: its dependencies, then itself.
    pub fn load_order<'a>(&'a self, module: &'a PackModule) -> Vec<&'a PackModule> {
        module
            .deps
            .iter()
            .filter_map(|d| self.modules.get(d))
            .chain(std::iter::once(module))
            .collect()
    }

    fn insert_module(&mut self, module: PackModule) -> Result<(), String> {
        insert_once(&mut self.modules, module.name.clone(), module, "module")
    }

    fn insert_firmware(&mut self, fw: PackFirmware) -> Result<(), String> {
        insert_once(&mut self.firmware, fw.name.clone(), fw, "firmware")
    }

    fn check_references(&self) -> Result<(), String> {
        for m in self.modules.values() {
            if let Some(d) = m.deps.iter().find(|d| !self.modules.contains_key(*d)) {
                return Err(format!(
                    "module {} depends on {d}, which is not in the pack",
                    m.name
                ));
            }
            if let Some(f) = m.firmware.iter().find(|f| !self.firmware.contains_key(*f)) {
                return Err(format!(
                    "module {} names firmware {f}, which is not in the pack",
                    m.name
                ));
            }
        }
        if let Some(a) = self
            .aliases
            .aliases()
            .iter()
            .find(|a| !self.modules.contains_key(&a.module))
        {
            return Err(format!(
                "alias {} names module {}, which is not in the pack",
                a.pattern, a.module
            ));
        }
        Ok(())
    }
}

/// Adds `value` under `name` unless the map is full or has the name already.
fn insert_once<T>(
    map: &mut BTreeMap<String, T>,
    name: String,
    value: T,
    what: &str,
) -> Result<(), String> {
    if map.len() >= MAX_ENTRIES {
        return Err(format!("more than {MAX_ENTRIES} {what} entries"));
    }
    if map.contains_key(&name) {
        return Err(format!("{what} {name} declared twice"));
    }
    map.insert(name, value);
    Ok(())
}

fn join(items: &[String]) -> String {
    if items.is_empty() {
        "-".to_owned()
    } else {
        items.join(",")
    }
}

fn list(word: &str) -> impl Iterator<Item = &str> {
    let word = if word == "-" { "" } else { word };
    word.split(',').filter(|s| !s.is_empty())
}

fn size(word: &str) -> Result<u64, String> {
    let bytes: u64 = word
        .parse()
        .map_err(|_| format!("{word:?} is not a byte count"))?;
    check_size(bytes)
}

fn check_size(bytes: u64) -> Result<u64, String> {
    if bytes > MAX_FILE_BYTES {
        return Err(format!(
            "{bytes} bytes is more than the {MAX_FILE_BYTES} accepted"
        ));
    }
    Ok(bytes)
}

/// A module name: letters, digits, `_` and `-` (kept as `_`).
fn module_name(word: &str) -> Result<String, String> {
    check_name(word, false).map_err(|r| format!("module name {word:?}: {r}"))?;
    Ok(word.replace('-', "_"))
}

/// A firmware path under `/lib/firmware`: relative, `/`-separated, no `.` or `..` part.
fn firmware_name(word: &str) -> Result<String, String> {
    check_name(word, true).map_err(|r| format!("firmware name {word:?}: {r}"))?;
    if word.starts_with('/')
        || word
            .split('/')
            .any(|part| part.is_empty() || part == "." || part == "..")
    {
        return Err(format!("firmware name {word:?}: not a plain relative path"));
    }
    Ok(word.to_owned())
}

fn check_name(word: &str, slashes: bool) -> Result<(), &'static str> {
    if word.is_empty() || word.len() > 255 {
        return Err("empty or longer than 255 bytes");
    }
    let ok = word.bytes().all(|b| {
        b.is_ascii_alphanumeric()
            || matches!(b, b'_' | b'-' | b'.' | b'+')
            || (slashes && b == b'/')
    });
    if !ok {
        return Err("a byte other than a letter, a digit or _ - . +");
    }
    Ok(())
}

/// A file name in [`DIR`]: ISO 9660 d-characters, one dot, at most 30 bytes (what our ISO
/// writer takes; `;1` is not part of it).
fn iso_file_name(word: &str) -> Result<String, String> {
    let ok = !word.is_empty()
        && word.len() <= 30
        && word.bytes().filter(|&b| b == b'.').count() == 1
        && word
            .bytes()
            .all(|b| b.is_ascii_uppercase() || b.is_ascii_digit() || b == b'_' || b == b'.');
    if !ok {
        return Err(format!(
            "file name {word:?} is not an ISO 9660 name (A-Z 0-9 _, one dot, 30 bytes)"
        ));
    }
    Ok(word.to_owned())
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    const SAMPLE: &str = "# a pack\n\
vmdeploy-driver-pack 1\n\
kernel 6.1.0-57-amd64\n\
module dca M0001.XZ 18000 - -\n\
module i2c-algo-bit M0002.XZ 20000 - -\n\
module igb M0003.XZ 472312 dca,i2c_algo_bit -\n\
module bnx2x M0004.XZ 1716600 - bnx2x/bnx2x-e2-7.13.21.0.fw\n\
firmware bnx2x/bnx2x-e2-7.13.21.0.fw F0001.XZ 273864\n\
alias pci:v00008086d000010C9sv*sd*bc*sc*i* igb\n\
alias pci:v000014E4d0000168Esv*sd*bc*sc*i* bnx2x\n\
alias pci:v00008086d*sv*sd*bc02sc00i* igb\n";

    #[test]
    fn reads_modules_firmware_and_aliases() {
        let pack = DriverPack::parse(SAMPLE).expect("sample parses");
        assert_eq!(pack.kernel, "6.1.0-57-amd64");
        let igb = pack.module("igb").expect("igb");
        assert_eq!(igb.file, "M0003.XZ");
        assert_eq!(igb.bytes, 472_312);
        assert_eq!(igb.deps, vec!["dca", "i2c_algo_bit"]);
        assert!(pack.module("i2c-algo-bit").is_some(), "`-` and `_` alike");
        let order: Vec<&str> = pack
            .load_order(igb)
            .iter()
            .map(|m| m.name.as_str())
            .collect();
        assert_eq!(order, vec!["dca", "i2c_algo_bit", "igb"]);
        let fw = pack
            .firmware("bnx2x/bnx2x-e2-7.13.21.0.fw")
            .expect("firmware");
        assert_eq!((fw.file.as_str(), fw.bytes), ("F0001.XZ", 273_864));
    }

    #[test]
    fn matches_a_device_once_per_module() {
        let pack = DriverPack::parse(SAMPLE).expect("sample parses");
        // An 82576 NIC matches igb by id and by class: igb once.
        let names: Vec<&str> = pack
            .modules_for("pci:v00008086d000010C9sv0000103Csd0000323Fbc02sc00i00")
            .iter()
            .map(|m| m.name.as_str())
            .collect();
        assert_eq!(names, vec!["igb"]);
        assert!(pack
            .modules_for("pci:v00001000d00000060sv00001000sd00001013bc01sc04i00")
            .is_empty());
    }

    #[test]
    fn render_parses_back() {
        let pack = DriverPack::parse(SAMPLE).expect("sample parses");
        let again = DriverPack::parse(&pack.render().expect("renders")).expect("reparses");
        assert_eq!(
            again.render().expect("renders"),
            pack.render().expect("renders")
        );
        assert_eq!(again.modules().count(), 4);
    }

    #[test]
    fn refuses_what_breaks_the_format_and_names_the_line() {
        let cases: &[(&str, &str)] = &[
            ("kernel 6.1\n", "line 1: the first record must be"),
            (
                "vmdeploy-driver-pack 1\nkernel 6.1\nmodule x M1.XZ 10 - -\nmodule x M2.XZ 10 - -\n",
                "line 4: module x declared twice",
            ),
            (
                "vmdeploy-driver-pack 1\nkernel 6.1\nmodule x m1.xz 10 - -\n",
                "line 3: file name \"m1.xz\" is not an ISO 9660 name",
            ),
            (
                "vmdeploy-driver-pack 1\nkernel 6.1\nfirmware ../etc/shadow F1.XZ 10\n",
                "line 3: firmware name \"../etc/shadow\": not a plain relative path",
            ),
            (
                "vmdeploy-driver-pack 1\nkernel 6.1\nfirmware /etc/shadow F1.XZ 10\n",
                "not a plain relative path",
            ),
            (
                "vmdeploy-driver-pack 1\nkernel 6.1\nmodule x M1.XZ 99999999999 - -\n",
                "line 3: 99999999999 bytes is more than",
            ),
            (
                "vmdeploy-driver-pack 1\nkernel 6.1\nmodule x M1.XZ 10 x -\n",
                "line 3: a module cannot depend on itself",
            ),
            (
                "vmdeploy-driver-pack 1\nkernel 6.1\nmodule x M1.XZ 10 y -\n",
                "module x depends on y, which is not in the pack",
            ),
            (
                "vmdeploy-driver-pack 1\nkernel 6.1\nmodule x M1.XZ 10 - fw.bin\n",
                "module x names firmware fw.bin, which is not in the pack",
            ),
            (
                "vmdeploy-driver-pack 1\nkernel 6.1\nalias pci:* nope\n",
                "names module nope, which is not in the pack",
            ),
            ("vmdeploy-driver-pack 1\nmodule x M1.XZ 10 - -\n", "no `kernel` record"),
            ("vmdeploy-driver-pack 1\nkernel 6.1\nwhat is this\n", "line 3: `what` with 3 words"),
            ("", "empty"),
        ];
        for (text, want) in cases {
            let err = DriverPack::parse(text).expect_err(text).to_string();
            assert!(err.contains(want), "{text:?}: {err:?} lacks {want:?}");
        }
    }

    fn arb_pack() -> impl Strategy<Value = DriverPack> {
        (
            proptest::collection::btree_set("[a-z][a-z0-9_]{0,12}", 1..12),
            proptest::collection::btree_set(
                "[a-z0-9]{1,8}(/[a-z0-9_-][a-z0-9._-]{0,11}){0,2}",
                0..6,
            ),
        )
            .prop_flat_map(|(modules, firmware)| {
                let modules: Vec<String> = modules.into_iter().collect();
                let firmware: Vec<String> = firmware.into_iter().collect();
                let n = modules.len();
                let f = firmware.len();
                (
                    Just(modules),
                    Just(firmware),
                    proptest::collection::vec(
                        (
                            proptest::collection::vec(0..n, 0..3),
                            proptest::collection::vec(0..f.max(1), 0..3),
                            0..=MAX_FILE_BYTES,
                        ),
                        n,
                    ),
                    proptest::collection::vec((0..n, "[a-z0-9:*?]{1,30}"), 0..10),
                )
            })
            .prop_map(|(modules, firmware, shapes, aliases)| {
                let mut pack = DriverPack::new("6.1.0-57-amd64");
                for (i, f) in firmware.iter().enumerate() {
                    pack.add_firmware(PackFirmware {
                        name: f.clone(),
                        file: format!("F{i:04}.XZ"),
                        bytes: i as u64,
                    })
                    .expect("distinct firmware");
                }
                for (i, (name, (deps, fws, bytes))) in modules.iter().zip(shapes).enumerate() {
                    let mut dep_names: Vec<String> = deps
                        .into_iter()
                        .map(|d| modules[d].clone())
                        .filter(|d| d != name)
                        .collect();
                    dep_names.dedup();
                    let fw_names: Vec<String> = if firmware.is_empty() {
                        Vec::new()
                    } else {
                        fws.into_iter().map(|x| firmware[x].clone()).collect()
                    };
                    pack.add_module(PackModule {
                        name: name.clone(),
                        file: format!("M{i:04}.XZ"),
                        bytes,
                        deps: dep_names,
                        firmware: fw_names,
                    })
                    .expect("distinct modules");
                }
                for (m, pattern) in aliases {
                    pack.add_alias(&pattern, &modules[m])
                        .expect("a plain pattern");
                }
                pack
            })
    }

    proptest! {
        #[test]
        fn rendered_packs_parse_back_the_same(pack in arb_pack()) {
            let text = pack.render().expect("a consistent pack renders");
            let again = DriverPack::parse(&text).expect("its text parses");
            prop_assert_eq!(again.render().expect("renders"), text);
            prop_assert_eq!(again.modules().cloned().collect::<Vec<_>>(), pack.modules().cloned().collect::<Vec<_>>());
            prop_assert_eq!(again.firmware_files().cloned().collect::<Vec<_>>(), pack.firmware_files().cloned().collect::<Vec<_>>());
        }

        #[test]
        fn never_panics_on_arbitrary_text(text in "(vmdeploy-driver-pack 1\n)?(kernel [a-z0-9.-]{1,8}\n)?((module|firmware|alias|kernel) [ -~]{0,60}\n){0,12}") {
            let _ = DriverPack::parse(&text);
        }

        #[test]
        fn never_panics_on_arbitrary_bytes(bytes in proptest::collection::vec(any::<u8>(), 0..400)) {
            let _ = DriverPack::parse(&String::from_utf8_lossy(&bytes));
        }
    }
}
