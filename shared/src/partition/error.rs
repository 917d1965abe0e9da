//! What can go wrong planning or rendering a partition layout.

/// What went wrong planning or rendering a partition layout.
#[derive(Debug, thiserror::Error)]
pub enum PartitionError {
    /// The sector size is neither 512 nor 4096 bytes.
    #[error("logical sector size {0} is not supported (512 or 4096 bytes)")]
    UnsupportedSectorSize(u32),
    /// A size or offset does not fit in 64 bits.
    #[error("the {0} size overflows")]
    Overflow(&'static str),
    /// The partitions do not fit on the disk.
    #[error(
        "the disk is too small: the layout needs {needed} bytes ({needed_mib} MiB) up to the end \
         of the last partition, the disk has {usable} usable bytes ({usable_mib} MiB) of {disk} \
         bytes",
        needed_mib = needed.div_ceil(super::MIB),
        usable_mib = usable / super::MIB
    )]
    DiskTooSmall {
        /// Bytes needed up to the end of the last partition.
        needed: u64,
        /// Bytes usable for partitions (before the backup GPT, below the MBR limit).
        usable: u64,
        /// The disk size in bytes.
        disk: u64,
    },
    /// The root image does not fit in the root partition.
    #[error(
        "the image ({image_bytes} bytes, {image_mib} MiB) is larger than the root partition \
         ({root_bytes} bytes, {root_mib} MiB)",
        image_mib = image_bytes.div_ceil(super::MIB),
        root_mib = root_bytes / super::MIB
    )]
    ImageLargerThanRoot {
        /// The image's virtual size.
        image_bytes: u64,
        /// The root partition's size.
        root_bytes: u64,
    },
    /// An MBR holds 4 primary partitions.
    #[error(
        "the layout needs {0} partitions but an MBR holds 4 primary partitions (extended/logical \
         partitions are not built): use GPT (UEFI) or drop a partition"
    )]
    TooManyMbrPartitions(usize),
    /// An MBR entry cannot address the partition.
    #[error(
        "partition {number} ends at sector {end_sector}, beyond what an MBR can address \
         (2^32 sectors): use GPT (UEFI)"
    )]
    BeyondMbrLimit {
        /// Partition number.
        number: u32,
        /// Its end sector (exclusive).
        end_sector: u64,
    },
    /// A [`super::Layout`] given to [`super::render`] is not one [`super::plan`] makes.
    #[error("invalid layout: {0}")]
    InvalidLayout(String),
    /// [`super::DiskIds`] has no GUID for a partition.
    #[error("no partition GUID given for partition {0}")]
    MissingPartitionGuid(u32),
    /// The system's random source failed while making identifiers.
    #[error("reading random bytes for disk identifiers: {0}")]
    Random(String),
    /// The `gpt` crate refused the table.
    #[error("building the GPT: {0}")]
    Gpt(#[source] gpt::GptError),
    /// The `gpt` crate could not write the protective MBR.
    #[error("building the protective MBR: {0}")]
    ProtectiveMbr(#[source] gpt::mbr::MBRError),
    /// The `mbrman` crate refused the table.
    #[error("building the MBR: {0}")]
    Mbr(#[source] mbrman::Error),
    /// The swap area is smaller than `mkswap` accepts.
    #[error(
        "a swap area of {0} bytes is too small (mkswap needs at least 10 pages of 4096 bytes)"
    )]
    SwapTooSmall(u64),
    /// The swap area has more pages than the header can count.
    #[error("a swap area of {0} bytes has more pages than a swap header can count (2^32)")]
    SwapTooLarge(u64),
    /// The swap label does not fit.
    #[error("swap label {0:?} must be at most 16 bytes with no NUL")]
    BadSwapLabel(String),
}
