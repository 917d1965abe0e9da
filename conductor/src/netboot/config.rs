//! The boot configuration files of one node, as text: PXELINUX (BIOS PXE ROMs), GRUB (UEFI
//! PXE) and an iPXE script (iPXE ROMs, and iPXE chain-loaded by either), and the MAC file names
//! each boot loader looks its configuration up by (Ironic's names, so a site's DHCP and TFTP
//! layout carries over).
//!
//! # Design
//! Pure text: no files, no I/O ([`super::files`] writes them). Every loader boots the same
//! [`BootEntry`]: a kernel, an initramfs and a command line. Paths are relative to the boot
//! root (TFTP and HTTP serve the same directory); iPXE gets absolute `http://` URLs, since it
//! fetches over HTTP whatever server handed it the script.

use std::fmt::Write as _;

use anyhow::bail;

/// What a loader boots: files under the boot root and a kernel command line.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BootEntry {
    /// A label for menus and logs (`deploy`, `instance`).
    pub label: String,
    /// The kernel, relative to the boot root (`<node>/deploy_kernel`).
    pub kernel: String,
    /// The initramfs, relative to the boot root.
    pub initrd: String,
    /// The kernel command line (one line, no `initrd=`: each loader adds what it needs).
    pub cmdline: String,
}

impl BootEntry {
    /// Checks what a boot loader's configuration syntax cannot carry: line breaks anywhere,
    /// white space or quotes in a path, and `;`/`"` (GRUB and iPXE command separators and
    /// quoting) in the command line.
    pub fn check(&self) -> anyhow::Result<()> {
        for (what, path) in [("kernel", &self.kernel), ("initrd", &self.initrd)] {
            if path.is_empty()
                || path.starts_with('/')
                || path.contains(|c: char| c.is_whitespace() || c.is_control() || c == '"')
                || path.split('/').any(|p| p == "..")
            {
                bail!(
                    "boot entry {}: {what} path {path:?} cannot go in a boot configuration",
                    self.label
                );
            }
        }
        if self
            .cmdline
            .contains(|c: char| c.is_control() || matches!(c, ';' | '"' | '`' | '$'))
        {
            bail!(
                "boot entry {}: the kernel command line holds a character a boot configuration \
                 cannot carry (a control character, ;, \", ` or $)",
                self.label
            );
        }
        Ok(())
    }

    /// The file name part of the initrd path (what iPXE names the image it fetched, and so
    /// the `initrd=` an EFI-stub kernel loads it by).
    fn initrd_name(&self) -> &str {
        self.initrd.rsplit('/').next().unwrap_or(&self.initrd)
    }
}

/// A MAC address as the boot loaders spell it in file names: lower case, `-` between octets.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Mac([u8; 6]);

impl Mac {
    /// Parses `aa:bb:cc:dd:ee:ff` (or with `-`), any case.
    pub fn parse(text: &str) -> anyhow::Result<Mac> {
        let parts: Vec<&str> = text.trim().split([':', '-']).collect();
        let mut out = [0u8; 6];
        if parts.len() != 6 {
            bail!("{text:?} is not a MAC address (six hex octets)");
        }
        for (slot, part) in out.iter_mut().zip(&parts) {
            if part.len() != 2 {
                bail!("{text:?} is not a MAC address (six hex octets)");
            }
            *slot = u8::from_str_radix(part, 16)
                .map_err(|_| anyhow::anyhow!("{text:?} is not a MAC address (six hex octets)"))?;
        }
        Ok(Mac(out))
    }

    /// `aa-bb-cc-dd-ee-ff`.
    pub fn hyphens(&self) -> String {
        self.join('-')
    }

    /// `aa:bb:cc:dd:ee:ff`.
    pub fn colons(&self) -> String {
        self.join(':')
    }

    fn join(&self, sep: char) -> String {
        let mut s = String::with_capacity(17);
        for (i, b) in self.0.iter().enumerate() {
            if i > 0 {
                s.push(sep);
            }
            let _ = write!(s, "{b:02x}");
        }
        s
    }

    /// `BOOTIF=01-aa-bb-...` as PXELINUX's `ipappend 2` writes it (ARP type 1, Ethernet); the
    /// ramdisk finds its boot interface by it.
    pub fn bootif(&self) -> String {
        format!("BOOTIF=01-{}", self.hyphens())
    }
}

/// PXELINUX looks up `pxelinux.cfg/01-<mac>` first (ARP type 1, then the MAC).
pub fn pxelinux_mac_file(mac: &Mac) -> String {
    format!("pxelinux.cfg/01-{}", mac.hyphens())
}

/// GRUB's network image looks up `grub.cfg-01-<mac>` in its prefix (the boot root here).
pub fn grub_mac_file(mac: &Mac) -> String {
    format!("grub.cfg-01-{}", mac.hyphens())
}

/// The master iPXE script ([`master_ipxe`]) chains `pxelinux.cfg/<mac>` (iPXE's
/// `${mac:hexhyp}`, no ARP type prefix: Ironic's iPXE name).
pub fn ipxe_mac_file(mac: &Mac) -> String {
    format!("pxelinux.cfg/{}", mac.hyphens())
}

/// The name of the master iPXE script at the boot root; DHCP hands iPXE clients its URL.
pub const MASTER_IPXE: &str = "boot.ipxe";

/// The master iPXE script: every iPXE client the site's DHCP points here fetches it and chains
/// the per-node script by the MAC it booted from; a server that is not being deployed gets a
/// line on its console saying so and falls back to its next boot device.
pub fn master_ipxe() -> String {
    "#!ipxe\n\
     # vmdeploy: the per-node script, selected by the MAC this ROM booted from.\n\
     chain pxelinux.cfg/${mac:hexhyp} || goto none\n\
     :none\n\
     echo vmdeploy: no boot configuration for ${mac}: this server is not being deployed\n\
     exit 1\n"
        .to_string()
}

/// PXELINUX: one entry, booted at once.
pub fn pxelinux(entry: &BootEntry) -> String {
    format!(
        "# vmdeploy: {label}\n\
         default {label}\n\
         prompt 0\n\
         timeout 0\n\
         label {label}\n\
         \x20 kernel {kernel}\n\
         \x20 append initrd={initrd} {cmdline}\n",
        label = entry.label,
        kernel = entry.kernel,
        initrd = entry.initrd,
        cmdline = entry.cmdline,
    )
}

/// GRUB (UEFI): one entry, booted at once, the files read from the server GRUB booted from.
pub fn grub(entry: &BootEntry) -> String {
    format!(
        "# vmdeploy: {label}\n\
         set default=0\n\
         set timeout=0\n\
         menuentry \"{label}\" {{\n\
         \x20 linux /{kernel} {cmdline}\n\
         \x20 initrd /{initrd}\n\
         }}\n",
        label = entry.label,
        kernel = entry.kernel,
        initrd = entry.initrd,
        cmdline = entry.cmdline,
    )
}

/// iPXE: kernel and initrd over HTTP from `http_url` (the boot root's URL, no trailing `/`).
/// The initrd is named, and `initrd=<name>` is on the command line: an EFI-stub kernel started
/// by iPXE under UEFI loads its initramfs by that name; under BIOS the word is ignored.
pub fn ipxe(entry: &BootEntry, http_url: &str) -> String {
    let base = http_url.trim_end_matches('/');
    let name = entry.initrd_name();
    format!(
        "#!ipxe\n\
         # vmdeploy: {label}\n\
         kernel {base}/{kernel} initrd={name} {cmdline} || goto fail\n\
         initrd --name {name} {base}/{initrd} || goto fail\n\
         boot\n\
         :fail\n\
         echo vmdeploy: fetching the {label} kernel or initrd from {base} failed\n\
         exit 1\n",
        label = entry.label,
        kernel = entry.kernel,
        initrd = entry.initrd,
        cmdline = entry.cmdline,
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry() -> BootEntry {
        BootEntry {
            label: "deploy".into(),
            kernel: "1be26c0b/deploy_kernel".into(),
            initrd: "1be26c0b/deploy_ramdisk".into(),
            cmdline: "deployment_id=1be26c0b BOOTIF=01-52-54-00-12-34-56".into(),
        }
    }

    #[test]
    fn macs_are_spelt_as_each_loader_looks_them_up() {
        let mac = Mac::parse("52:54:00:AB:cd:0F").expect("mac");
        assert_eq!(mac.colons(), "52:54:00:ab:cd:0f");
        assert_eq!(pxelinux_mac_file(&mac), "pxelinux.cfg/01-52-54-00-ab-cd-0f");
        assert_eq!(grub_mac_file(&mac), "grub.cfg-01-52-54-00-ab-cd-0f");
        assert_eq!(ipxe_mac_file(&mac), "pxelinux.cfg/52-54-00-ab-cd-0f");
        assert_eq!(mac.bootif(), "BOOTIF=01-52-54-00-ab-cd-0f");
        assert_eq!(Mac::parse("52-54-00-ab-cd-0f").expect("hyphens"), mac);
        for bad in [
            "",
            "52:54:00:ab:cd",
            "52:54:00:ab:cd:0f:11",
            "52:54:00:ab:cd:zz",
            "5:54:00:ab:cd:0f1",
        ] {
            assert!(Mac::parse(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn each_loader_boots_the_entry() {
        let e = entry();
        let p = pxelinux(&e);
        assert!(p.contains("default deploy\n"), "{p}");
        assert!(p.contains("  kernel 1be26c0b/deploy_kernel\n"), "{p}");
        assert!(
            p.contains("  append initrd=1be26c0b/deploy_ramdisk deployment_id=1be26c0b BOOTIF=01-52-54-00-12-34-56\n"),
            "{p}"
        );
        let g = grub(&e);
        assert!(
            g.contains("  linux /1be26c0b/deploy_kernel deployment_id=1be26c0b"),
            "{g}"
        );
        assert!(g.contains("  initrd /1be26c0b/deploy_ramdisk\n"), "{g}");
        let i = ipxe(&e, "http://10.0.2.102:8080/");
        assert!(i.starts_with("#!ipxe\n"), "{i}");
        assert!(
            i.contains("kernel http://10.0.2.102:8080/1be26c0b/deploy_kernel initrd=deploy_ramdisk deployment_id=1be26c0b"),
            "{i}"
        );
        assert!(
            i.contains(
                "initrd --name deploy_ramdisk http://10.0.2.102:8080/1be26c0b/deploy_ramdisk"
            ),
            "{i}"
        );
        assert!(master_ipxe().contains("chain pxelinux.cfg/${mac:hexhyp}"));
    }

    #[test]
    fn what_a_configuration_cannot_carry_is_refused() {
        assert!(entry().check().is_ok());
        for cmdline in ["a\nb", "a;reboot", "x=\"y\"", "x=${net0/ip}"] {
            let e = BootEntry {
                cmdline: cmdline.into(),
                ..entry()
            };
            assert!(e.check().is_err(), "{cmdline:?}");
        }
        for path in ["", "/abs/k", "a b/k", "../k", "a/../../k"] {
            let e = BootEntry {
                kernel: path.into(),
                ..entry()
            };
            assert!(e.check().is_err(), "{path:?}");
        }
    }
}
