//! Block device ioctls (linux/fs.h): size, sector sizes, partition table re-read.

use std::fs::File;
use std::io;
use std::os::fd::AsRawFd;

mod ioctl {
    // Numbers from linux/fs.h: BLKRRPART _IO(0x12,95), BLKSSZGET _IO(0x12,104),
    // BLKGETSIZE64 _IOR(0x12,114,size_t), BLKPBSZGET _IO(0x12,123).
    nix::ioctl_none!(blkrrpart, 0x12, 95);
    nix::ioctl_read_bad!(blksszget, nix::request_code_none!(0x12, 104), libc::c_int);
    nix::ioctl_read!(blkgetsize64, 0x12, 114, u64);
    nix::ioctl_read_bad!(blkpbszget, nix::request_code_none!(0x12, 123), libc::c_uint);
}

/// Size of a block device in bytes (BLKGETSIZE64).
pub fn block_device_size(dev: &File) -> io::Result<u64> {
    let mut size: u64 = 0;
    // SAFETY: the fd is open for the duration of the call and `size` is a valid u64 the kernel
    // writes into (BLKGETSIZE64 writes one u64).
    unsafe { ioctl::blkgetsize64(dev.as_raw_fd(), &mut size) }.map_err(io::Error::from)?;
    Ok(size)
}

/// Logical sector size of a block device (BLKSSZGET): the O_DIRECT alignment unit.
pub fn logical_block_size(dev: &File) -> io::Result<u32> {
    let mut size: libc::c_int = 0;
    // SAFETY: the fd is open and `size` is a valid c_int the kernel writes (BLKSSZGET writes an int).
    unsafe { ioctl::blksszget(dev.as_raw_fd(), &mut size) }.map_err(io::Error::from)?;
    u32::try_from(size)
        .ok()
        .filter(|s| s.is_power_of_two())
        .ok_or_else(|| io::Error::other(format!("device reports a bad sector size {size}")))
}

/// Physical sector size of a block device (BLKPBSZGET).
pub fn physical_block_size(dev: &File) -> io::Result<u32> {
    let mut size: libc::c_uint = 0;
    // SAFETY: the fd is open and `size` is a valid c_uint the kernel writes (BLKPBSZGET writes an
    // unsigned int).
    unsafe { ioctl::blkpbszget(dev.as_raw_fd(), &mut size) }.map_err(io::Error::from)?;
    Some(size).filter(|s| s.is_power_of_two()).ok_or_else(|| {
        io::Error::other(format!("device reports a bad physical sector size {size}"))
    })
}

/// Asks the kernel to re-read the partition table (BLKRRPART).
pub fn reread_partition_table(dev: &File) -> io::Result<()> {
    // SAFETY: BLKRRPART takes no argument; the fd is open for the call.
    unsafe { ioctl::blkrrpart(dev.as_raw_fd()) }.map_err(io::Error::from)?;
    Ok(())
}
