//! The boot loaders' configuration files: isolinux.cfg for the BIOS entry and grub.cfg for the
//! UEFI entry. Both boot at once (no prompt, no timeout) with the serial console first and the
//! caller's command line after it.

use super::IsoError;

/// What both menus put before the caller's command line: kernel messages on the screen and on
/// the first serial port (where tests, the iLO's virtual serial port and the emulator read them).
pub const CONSOLE_ARGS: &str = "console=tty0 console=ttyS0,115200";

/// Longest command line we accept: the x86 boot protocol's limit is 2048 bytes including the
/// console arguments and the terminating NUL.
pub const MAX_CMDLINE: usize = 2048 - CONSOLE_ARGS.len() - 2;

/// ISO paths (as the loaders see them: GRUB and isolinux show plain ISO 9660 names in lower
/// case, without the `;1` version) of the files the configs name.
pub const KERNEL_PATH: &str = "/boot/vmlinuz";
/// See [`KERNEL_PATH`].
pub const INITRD_PATH: &str = "/boot/initrd";

/// The whole command line both loaders pass, after checking the caller's part: printable ASCII
/// only, because a newline would end the config line (and start a new config command), a `"` or
/// `'` or `\` or `$` would be read by GRUB's shell-like parser, and isolinux takes the rest of
/// the line as is.
pub fn full_cmdline(cmdline: &str) -> Result<String, IsoError> {
    if cmdline.len() > MAX_CMDLINE {
        return Err(IsoError::Invalid(format!(
            "the kernel command line is {} bytes; at most {MAX_CMDLINE} fit",
            cmdline.len()
        )));
    }
    if let Some(bad) = cmdline
        .chars()
        .find(|c| !(' '..='~').contains(c) || matches!(c, '"' | '\'' | '\\' | '$' | ';'))
    {
        return Err(IsoError::Invalid(format!(
            "the kernel command line contains {bad:?}, which a boot loader config cannot carry \
             safely (allowed: printable ASCII without quotes, backslash, `$` and `;`)"
        )));
    }
    let rest = cmdline.trim();
    Ok(if rest.is_empty() {
        CONSOLE_ARGS.to_owned()
    } else {
        format!("{CONSOLE_ARGS} {rest}")
    })
}

/// isolinux.cfg: serial console, boot the only entry at once.
///
/// The initramfs is named by `initrd=` at the start of APPEND rather than by an INITRD line:
/// isolinux adds INITRD's `initrd=` at the end of the command line, where it would land after a
/// `--` and reach init as an argument.
pub fn isolinux_cfg(full_cmdline: &str) -> String {
    format!(
        "SERIAL 0 115200\n\
         DEFAULT boot\n\
         PROMPT 0\n\
         TIMEOUT 0\n\
         LABEL boot\n\
         \x20 KERNEL {KERNEL_PATH}\n\
         \x20 APPEND initrd={INITRD_PATH} {full_cmdline}\n"
    )
}

/// grub.cfg, read from the ISO 9660 tree after the EFI binary's embedded config found it by its
/// volume label ([`super::GRUB_EARLY_CONFIG`]): GRUB's own output goes to the serial port too.
pub fn grub_cfg(full_cmdline: &str) -> String {
    format!(
        "serial --unit=0 --speed=115200\n\
         terminal_input serial console\n\
         terminal_output serial console\n\
         set timeout=0\n\
         set default=0\n\
         menuentry \"boot\" {{\n\
         \x20 linux {KERNEL_PATH} {full_cmdline}\n\
         \x20 initrd {INITRD_PATH}\n\
         }}\n"
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn console_comes_first() {
        assert_eq!(
            full_cmdline("root=UUID=1234 ro").expect("valid"),
            "console=tty0 console=ttyS0,115200 root=UUID=1234 ro"
        );
        assert_eq!(full_cmdline("  ").expect("valid"), CONSOLE_ARGS);
    }

    #[test]
    fn config_breaking_characters_are_refused() {
        for bad in [
            "a\nb", "a\"b", "a'b", "a\\b", "$x", "a;b", "a\tb", "é", "a\0",
        ] {
            assert!(full_cmdline(bad).is_err(), "{bad:?} accepted");
        }
        assert!(full_cmdline(&"x".repeat(MAX_CMDLINE + 1)).is_err());
        assert!(full_cmdline(&"x".repeat(MAX_CMDLINE)).is_ok());
    }

    #[test]
    fn configs_carry_the_cmdline_once() {
        let line = full_cmdline("root=UUID=abc quiet").expect("valid");
        let iso = isolinux_cfg(&line);
        assert!(iso.contains(
            "APPEND initrd=/boot/initrd console=tty0 console=ttyS0,115200 root=UUID=abc quiet\n"
        ));
        assert!(iso.contains("TIMEOUT 0\n") && iso.contains("PROMPT 0\n"));
        let grub = grub_cfg(&line);
        assert!(grub.contains(
            "linux /boot/vmlinuz console=tty0 console=ttyS0,115200 root=UUID=abc quiet\n"
        ));
        assert!(grub.contains("set timeout=0\n"));
    }

    proptest! {
        /// Whatever is accepted stays on one config line and shows up verbatim.
        #[test]
        fn accepted_cmdlines_stay_on_one_line(s in "\\PC{0,80}") {
            if let Ok(line) = full_cmdline(&s) {
                prop_assert!(!line.contains('\n'));
                prop_assert!(line.ends_with(s.trim()));
                let cfg = isolinux_cfg(&line);
                prop_assert_eq!(cfg.lines().count(), 7);
            }
        }
    }
}
