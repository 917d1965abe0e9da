//! The partition image's own signed boot chain, for local boot under UEFI Secure Boot: the
//! distribution's shim and signed GRUB, read from the root file system just written (see
//! `vmdeploy_shared::partition::local_boot`, "Under UEFI Secure Boot"). The agent reads the
//! ext2/3/4 file system itself ([`vmdeploy_shared::ext4`]): no module, no mount, nothing
//! written to the instance's file system.

use std::io::{Read, Seek};

use anyhow::{bail, Context};
use vmdeploy_shared::ext4::{Ext4ReadError, Ext4Volume};
use vmdeploy_shared::partition::local_boot::{
    grub_prefix, SignedChainPaths, MAX_SIGNED_LOADER_BYTES, SIGNED_CHAINS,
};
use vmdeploy_shared::pe::certificate_table_len;

/// Shim and GRUB as read from the image.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SignedChain {
    /// Shim (first stage, signed by Microsoft's UEFI CA).
    pub shim: Vec<u8>,
    /// The distribution's signed GRUB.
    pub grub: Vec<u8>,
    /// Where that GRUB reads its configuration ([`grub_prefix`]), when it says.
    pub prefix: Option<String>,
    /// Where shim was found, for the log.
    pub shim_path: &'static str,
}

/// Refuses `bytes` unless it is a PE image with a signature: the firmware would refuse it at
/// the next boot, long after the deploy said it succeeded.
fn require_signed(path: &str, bytes: &[u8]) -> anyhow::Result<()> {
    match certificate_table_len(bytes) {
        None => bail!("{path} in the image is not an EFI (PE) image"),
        Some(0) => {
            bail!("{path} in the image carries no signature: UEFI Secure Boot would refuse it")
        }
        Some(_) => Ok(()),
    }
}

/// The signed chain in the ext2/3/4 file system in the `len` bytes at `offset` of `dev`: the
/// first of [`SIGNED_CHAINS`] whose shim is there.
pub fn read_from_root<R: Read + Seek>(
    dev: R,
    offset: u64,
    len: u64,
) -> anyhow::Result<SignedChain> {
    let mut fs = Ext4Volume::open(dev, offset, len)
        .context("reading the root file system (ext2/3/4) for its signed boot chain")?;
    for &SignedChainPaths { shim, grub } in SIGNED_CHAINS {
        let shim_bytes = match fs.read_file(shim, MAX_SIGNED_LOADER_BYTES) {
            Ok(bytes) => bytes,
            Err(Ext4ReadError::NotFound(_) | Ext4ReadError::NotADirectory(_)) => continue,
            Err(e) => return Err(e).with_context(|| format!("reading {shim} in the image")),
        };
        let grub_bytes = fs
            .read_file(grub, MAX_SIGNED_LOADER_BYTES)
            .with_context(|| format!("the image has {shim}, but its signed GRUB {grub}"))?;
        require_signed(shim, &shim_bytes)?;
        require_signed(grub, &grub_bytes)?;
        return Ok(SignedChain {
            prefix: grub_prefix(&grub_bytes),
            shim: shim_bytes,
            grub: grub_bytes,
            shim_path: shim,
        });
    }
    let looked: Vec<&str> = SIGNED_CHAINS.iter().map(|p| p.shim).collect();
    bail!(
        "UEFI Secure Boot is on, and the partition image carries no signed boot chain: none of \
         {} is in its root file system. Install the distribution's signed shim and GRUB in the \
         image (Debian and Ubuntu: the packages shim-signed and grub-efi-amd64-signed), or \
         deploy the node with Secure Boot off",
        looked.join(", ")
    )
}
