//! The kernel's module dependency index (`/lib/modules/<release>/modules.dep`, written by
//! `depmod`) and the load order it implies.
//!
//! # Format
//! One line per module: `kernel/path/mod.ko: kernel/dep1.ko kernel/dep2.ko`, paths relative to
//! the release directory, the list after the colon being the module's whole dependency closure.
//! A module's name is its file name without `.ko` (or `.ko.xz`/`.ko.zst`/`.ko.gz`), with `-`
//! and `_` equivalent (`crc-t10dif` is loaded as `crc_t10dif`), as kmod treats them.
//!
//! # Why our own order
//! The list after the colon is not in load order (depmod writes it deepest-last), so the order
//! is derived here: a depth-first walk where every module comes after the modules its own line
//! names. Debian's linux-image .deb ships no `modules.dep` (its postinst runs depmod): run
//! `depmod -b ROOT RELEASE` on the unpacked package first (docs/qemu-and-boot.md §2).

use std::collections::{BTreeMap, HashSet};

use anyhow::{bail, Context};

/// The parsed index: module name → (path, dependency paths).
#[derive(Debug, Default)]
pub struct ModuleIndex {
    by_name: BTreeMap<String, String>,
    deps: BTreeMap<String, Vec<String>>,
}

/// A module's canonical name from its path: file name, no `.ko*` suffix, `-` as `_`.
pub fn module_name(path: &str) -> Option<String> {
    let file = path.rsplit('/').next()?;
    let stem = [".ko", ".ko.xz", ".ko.zst", ".ko.gz"]
        .iter()
        .find_map(|suffix| file.strip_suffix(suffix))?;
    (!stem.is_empty()).then(|| stem.replace('-', "_"))
}

impl ModuleIndex {
    /// Parses `modules.dep` text. Malformed lines are errors (the file comes from depmod; a bad
    /// line means a bad file, not something to skip).
    pub fn parse(text: &str) -> anyhow::Result<ModuleIndex> {
        let mut index = ModuleIndex::default();
        for (n, line) in text.lines().enumerate() {
            let line = line.trim();
            if line.is_empty() || line.starts_with('#') {
                continue;
            }
            let (path, deps) = line
                .split_once(':')
                .with_context(|| format!("modules.dep line {}: no ':'", n + 1))?;
            let path = path.trim();
            if path.split('/').any(|p| p == "..") || path.starts_with('/') {
                bail!("modules.dep line {}: path {path:?} leaves the tree", n + 1);
            }
            let name = module_name(path)
                .with_context(|| format!("modules.dep line {}: {path:?} is no module", n + 1))?;
            let deps: Vec<String> = deps.split_whitespace().map(str::to_owned).collect();
            if let Some(bad) = deps
                .iter()
                .find(|d| d.split('/').any(|p| p == "..") || d.starts_with('/'))
            {
                bail!("modules.dep line {}: path {bad:?} leaves the tree", n + 1);
            }
            index.by_name.insert(name, path.to_owned());
            index.deps.insert(path.to_owned(), deps);
        }
        Ok(index)
    }

    /// Every module's path, by name.
    pub fn paths(&self) -> impl Iterator<Item = &str> {
        self.by_name.values().map(String::as_str)
    }

    /// The path of module `name` (`-`/`_` insensitive).
    pub fn path_of(&self, name: &str) -> Option<&str> {
        self.by_name
            .get(&name.replace('-', "_"))
            .map(String::as_str)
    }

    /// Paths of `names` and everything they need, each once, every module after its
    /// dependencies, otherwise in the order asked.
    pub fn load_order(&self, names: &[&str]) -> anyhow::Result<Vec<String>> {
        let mut order = Vec::new();
        let mut done = HashSet::new();
        for name in names {
            // A name nobody has is the operator's typo: a usage error (exit 64), not a failure.
            let path = self.path_of(name).ok_or_else(|| {
                vmdeploy_shared::exit::UsageError::new(format!(
                    "module {name:?} is not in modules.dep"
                ))
            })?;
            self.visit(path, &mut Vec::new(), &mut done, &mut order)?;
        }
        Ok(order)
    }

    fn visit(
        &self,
        path: &str,
        stack: &mut Vec<String>,
        done: &mut HashSet<String>,
        order: &mut Vec<String>,
    ) -> anyhow::Result<()> {
        if done.contains(path) {
            return Ok(());
        }
        if stack.iter().any(|p| p == path) {
            bail!("modules.dep has a dependency cycle through {path}");
        }
        let deps = self
            .deps
            .get(path)
            .with_context(|| format!("{path} is needed but has no line in modules.dep"))?;
        stack.push(path.to_owned());
        for dep in deps {
            self.visit(dep, stack, done, order)?;
        }
        stack.pop();
        done.insert(path.to_owned());
        order.push(path.to_owned());
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    // The real lines of Debian 6.1.0-57-amd64 for these modules (depmod output).
    const DEP: &str = "\
kernel/drivers/virtio/virtio_pci.ko: kernel/drivers/virtio/virtio_pci_legacy_dev.ko kernel/drivers/virtio/virtio_pci_modern_dev.ko kernel/drivers/virtio/virtio.ko kernel/drivers/virtio/virtio_ring.ko
kernel/drivers/virtio/virtio_pci_legacy_dev.ko:
kernel/drivers/virtio/virtio_pci_modern_dev.ko:
kernel/drivers/virtio/virtio.ko: kernel/drivers/virtio/virtio_ring.ko
kernel/drivers/virtio/virtio_ring.ko:
kernel/drivers/block/floppy.ko:
kernel/drivers/block/virtio_blk.ko: kernel/drivers/virtio/virtio.ko kernel/drivers/virtio/virtio_ring.ko
kernel/drivers/net/virtio_net.ko: kernel/drivers/net/net_failover.ko kernel/net/core/failover.ko kernel/drivers/virtio/virtio.ko kernel/drivers/virtio/virtio_ring.ko
kernel/drivers/net/net_failover.ko: kernel/net/core/failover.ko
kernel/net/core/failover.ko:
kernel/lib/crc-t10dif.ko: kernel/crypto/crct10dif_common.ko
kernel/crypto/crct10dif_common.ko:
";

    #[test]
    fn an_unknown_module_is_a_usage_error() {
        let index = ModuleIndex::parse(DEP).expect("parse");
        let err = index.load_order(&["no_such_driver"]).expect_err("unknown");
        assert!(format!("{err:#}").contains("no_such_driver"), "{err:#}");
        assert_eq!(
            vmdeploy_shared::exit::code_for(err.chain()),
            vmdeploy_shared::exit::USAGE
        );
    }

    #[test]
    fn order_puts_every_module_after_its_dependencies() {
        let index = ModuleIndex::parse(DEP).expect("parse");
        assert_eq!(index.by_name.len(), 12);
        let order = index
            .load_order(&["virtio_net", "virtio-blk", "floppy", "crc_t10dif"])
            .expect("order");
        let names: Vec<String> = order.iter().filter_map(|p| module_name(p)).collect();
        assert_eq!(
            names,
            [
                "failover",
                "net_failover",
                "virtio_ring",
                "virtio",
                "virtio_net",
                "virtio_blk",
                "floppy",
                "crct10dif_common",
                "crc_t10dif"
            ]
        );
        for (i, path) in order.iter().enumerate() {
            for dep in &index.deps[path] {
                let at = order.iter().position(|p| p == dep).expect("dep present");
                assert!(at < i, "{dep} must come before {path}");
            }
        }
    }

    #[test]
    fn unknown_modules_cycles_and_bad_lines_are_errors() {
        let index = ModuleIndex::parse(DEP).expect("parse");
        let err = index.load_order(&["e1000"]).expect_err("unknown");
        assert!(format!("{err:#}").contains("e1000"), "{err:#}");
        let cyclic = ModuleIndex::parse("a.ko: b.ko\nb.ko: a.ko\n").expect("parse");
        assert!(format!("{:#}", cyclic.load_order(&["a"]).expect_err("cycle")).contains("cycle"));
        assert!(ModuleIndex::parse("kernel/a.ko kernel/b.ko\n").is_err());
        assert!(ModuleIndex::parse("../a.ko:\n").is_err());
        assert!(ModuleIndex::parse("a.ko: /etc/passwd.ko\n").is_err());
        let dangling = ModuleIndex::parse("a.ko: b.ko\n").expect("parse");
        assert!(dangling.load_order(&["a"]).is_err());
    }

    proptest! {
        #[test]
        fn parse_and_order_never_panic(text in "([a-c/_.: -]{0,12}(ko)?\n){0,12}") {
            if let Ok(index) = ModuleIndex::parse(&text) {
                let names: Vec<String> = index.by_name.keys().cloned().collect();
                let refs: Vec<&str> = names.iter().map(String::as_str).collect();
                let _ = index.load_order(&refs);
            }
        }
    }
}
