//! The boot interfaces (docs/architecture.md §2): how a node boots the deploy ramdisk and,
//! after the deploy, the instance. `vmedia` boots from the iLO's virtual media (the floppy
//! with the ramdisk's parameters, the deploy ISO, a netboot instance's boot ISO); `pxe` boots
//! over the network from this conductor's TFTP/HTTP service (`crate::netboot`).

pub mod pxe;
pub mod vmedia;
