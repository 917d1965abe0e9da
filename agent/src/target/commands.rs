//! The SCSI command engine of the target: what each CDB does to the backing store and which
//! data or sense comes back. No iSCSI here; the connection layer moves the bytes.
//!
//! Execution is blocking (pread/pwrite/fdatasync): the connection runs it on the blocking pool.

use std::sync::Arc;

use sha2::{Digest, Sha256};
use vmdeploy_shared::iscsi::scsi::{
    self, asc, supported, truncate_to, BlockRange, Capacity, Failure, ScsiCommand, Sense, SenseKey,
};

use super::backend::{AlignedBuf, BlockBackend};
use super::budget::Reservation;
use super::reservations::{Nexus, Reservations};

mod pages;

/// The LUN number the disk is served as (Ironic uses LUN 1, docs/ironic-protocols.md §2.2).
pub const DISK_LUN: u64 = 1;

/// Largest READ/WRITE/VERIFY transfer in blocks (Block Limits MAXIMUM TRANSFER LENGTH): bounds the
/// memory one command can make the target allocate.
pub const MAX_TRANSFER_BYTES: u32 = 32 << 20;
/// Preferred transfer (Block Limits OPTIMAL TRANSFER LENGTH).
const OPTIMAL_TRANSFER_BYTES: u32 = 1 << 20;
/// Largest WRITE SAME in blocks (Block Limits MAXIMUM WRITE SAME LENGTH).
const MAX_WRITE_SAME_BLOCKS: u64 = 1 << 16;
/// Largest COMPARE AND WRITE in blocks (Block Limits MAXIMUM COMPARE AND WRITE LENGTH).
const MAX_COMPARE_AND_WRITE_BLOCKS: u32 = 255;
/// Largest total UNMAP LBA count and descriptor count (Block Limits).
const MAX_UNMAP_BLOCKS: u32 = 1 << 20;
const MAX_UNMAP_DESCRIPTORS: u32 = 256;

/// Data a command returns to the initiator.
#[derive(Debug)]
pub enum Payload {
    /// Read from the disk into an aligned buffer.
    Disk(AlignedBuf),
    /// Built in memory (INQUIRY, MODE SENSE, ...).
    Heap(Vec<u8>),
    /// A result whose bytes count against the session's share of the buffer budget until the
    /// last Data-In PDU that carries it has been sent and the payload is dropped.
    Reserved(Box<Payload>, Reservation),
}

impl Payload {
    /// The bytes.
    pub fn as_slice(&self) -> &[u8] {
        match self {
            Payload::Disk(b) => b,
            Payload::Heap(v) => v,
            Payload::Reserved(p, _) => p.as_slice(),
        }
    }
}

/// Result of one command: GOOD with optional data, or CHECK CONDITION with sense, or another
/// status (RESERVATION CONFLICT).
pub type Outcome = Result<Option<Payload>, Failure>;

/// Names the device reports about itself.
#[derive(Debug, Clone)]
pub struct Identity {
    /// Unit serial number (VPD 0x80), ASCII.
    pub serial: String,
    /// NAA 6 (IEEE registered extended) designator, 16 bytes.
    pub naa: [u8; 16],
    /// The target's iSCSI name (SCSI name string designator).
    pub target_name: String,
}

impl Identity {
    /// Stable identifiers derived from the target name and the disk path: the same node serves
    /// the same names across restarts, different targets never collide.
    pub fn derive(target_name: &str, disk: &std::path::Path) -> Self {
        let mut h = Sha256::new();
        h.update(target_name.as_bytes());
        h.update([0]);
        h.update(disk.as_os_str().as_encoded_bytes());
        let digest = h.finalize();
        let serial: String = digest[..8].iter().map(|b| format!("{b:02x}")).collect();
        let mut naa = [0u8; 16];
        // NAA 6, then a 24-bit OUI; 0x001405 is the one Linux LIO uses for software targets,
        // then 100 bits of vendor-specific identifier from the digest (SPC-4 §7.8.6.6.5).
        naa[0] = 0x60;
        naa[1] = 0x01;
        naa[2] = 0x40;
        naa[3] = 0x50 | (digest[8] & 0x0f);
        naa[4..16].copy_from_slice(&digest[9..21]);
        Self {
            serial,
            naa,
            target_name: target_name.to_owned(),
        }
    }
}

/// What a parsed command needs from the connection before it can run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Transfer {
    /// No data-out (the command may return data-in).
    None,
    /// Exactly this many data-out bytes (SPDTL of a WRITE, VERIFY with BYTCHK, WRITE SAME, UNMAP).
    Out(u32),
}

/// The logical unit: the backing store plus its identity.
#[derive(Debug)]
pub struct Lun {
    backend: Arc<BlockBackend>,
    identity: Identity,
    /// Serialises COMPARE AND WRITE and ORWRITE so each read-modify-write is atomic with respect
    /// to the others (SBC-3 §5.2, §5.8).
    compare_and_write: std::sync::Mutex<()>,
    /// SPC-2 and persistent reservations.
    reservations: Reservations,
}

impl Lun {
    /// A LUN over an opened backend.
    pub fn new(backend: Arc<BlockBackend>, identity: Identity) -> Self {
        Self {
            backend,
            identity,
            compare_and_write: std::sync::Mutex::new(()),
            reservations: Reservations::default(),
        }
    }

    /// The backing store.
    pub fn backend(&self) -> &Arc<BlockBackend> {
        &self.backend
    }

    /// An I_T nexus ended (logout or connection loss): see [`Reservations::nexus_lost`].
    pub fn nexus_lost(&self, nexus: &Nexus) {
        self.reservations.nexus_lost(nexus);
    }

    /// LOGICAL UNIT RESET or a target reset: see [`Reservations::reset`].
    pub fn reset(&self) {
        self.reservations.reset();
    }

    fn capacity(&self) -> Capacity {
        Capacity {
            blocks: self.backend.blocks(),
            block_len: self.backend.block_len(),
            physical_exponent: self.backend.physical_exponent(),
            thin: true,
            unmapped_reads_zero: true,
        }
    }

    fn block_len(&self) -> u64 {
        u64::from(self.backend.block_len())
    }

    /// Writes whole blocks from `lba` on; with FUA (SBC-3 §5.40) they reach the medium before
    /// the status goes out.
    fn write_blocks(&self, data: &[u8], lba: u64, fua: bool) -> Result<(), Sense> {
        self.backend
            .write_at(data, lba * self.block_len())
            .map_err(|e| io_sense(e, asc::WRITE_ERROR))?;
        if fua {
            self.backend
                .sync()
                .map_err(|e| io_sense(e, asc::WRITE_ERROR))?;
        }
        Ok(())
    }

    fn max_transfer_blocks(&self) -> u32 {
        MAX_TRANSFER_BYTES / self.backend.block_len()
    }

    /// Decodes a CDB for `lun` sent through `nexus` and checks everything that can be checked
    /// before data moves (LUN, reservations, ranges, limits). Returns the command and the
    /// data-out it needs.
    pub fn prepare(
        &self,
        nexus: &Nexus,
        lun: u64,
        cdb: &[u8; 16],
    ) -> Result<(ScsiCommand, Transfer), Failure> {
        let mut cmd = ScsiCommand::parse(cdb)?;
        if lun != DISK_LUN
            && !matches!(
                cmd,
                ScsiCommand::Inquiry { .. }
                    | ScsiCommand::ReportLuns { .. }
                    | ScsiCommand::RequestSense { .. }
            )
        {
            return Err(Sense::illegal_request(asc::LOGICAL_UNIT_NOT_SUPPORTED).into());
        }
        self.reservations.check(nexus, &cmd)?;
        let total = self.backend.blocks();
        let bl = self.backend.block_len();
        let range_ok = |r: &BlockRange| -> Result<(), Sense> {
            if !r.fits(total) {
                return Err(Sense::lba_out_of_range());
            }
            Ok(())
        };
        let transfer = match cmd {
            ScsiCommand::Read(r) => {
                range_ok(&r)?;
                self.check_transfer_len(cdb, r.blocks)?;
                Transfer::None
            }
            ScsiCommand::Write(r) => {
                range_ok(&r)?;
                self.check_transfer_len(cdb, r.blocks)?;
                Transfer::Out(r.blocks * bl)
            }
            ScsiCommand::Verify { range, byte_check } => {
                range_ok(&range)?;
                self.check_transfer_len(cdb, range.blocks)?;
                match byte_check {
                    0 => Transfer::None,
                    1 => Transfer::Out(range.blocks * bl),
                    _ if range.blocks == 0 => Transfer::None,
                    _ => Transfer::Out(bl),
                }
            }
            ScsiCommand::WriteSame {
                range,
                unmap,
                no_data_out,
            } => {
                let too_long = || {
                    let byte = if cdb[0] == scsi::opcode::WRITE_SAME_10 {
                        7
                    } else {
                        10
                    };
                    Sense::invalid_field_in_cdb(byte, None)
                };
                if u64::from(range.blocks) > MAX_WRITE_SAME_BLOCKS {
                    return Err(too_long().into());
                }
                range_ok(&range)?;
                if range.blocks == 0 {
                    // WSNZ=0 in Block Limits: zero blocks means up to the end of the medium
                    // (SBC-3 §5.42), within MAXIMUM WRITE SAME LENGTH like any other length.
                    let to_end = total - range.lba;
                    if to_end > MAX_WRITE_SAME_BLOCKS {
                        return Err(too_long().into());
                    }
                    cmd = ScsiCommand::WriteSame {
                        range: BlockRange {
                            blocks: to_end as u32,
                            ..range
                        },
                        unmap,
                        no_data_out,
                    };
                }
                if no_data_out {
                    Transfer::None
                } else {
                    Transfer::Out(bl)
                }
            }
            ScsiCommand::Unmap {
                parameter_list_length,
            } => Transfer::Out(parameter_list_length),
            ScsiCommand::SynchronizeCache { range } => {
                range_ok(&range)?;
                Transfer::None
            }
            ScsiCommand::WriteAndVerify { range, .. } | ScsiCommand::OrWrite(range) => {
                range_ok(&range)?;
                self.check_transfer_len(cdb, range.blocks)?;
                Transfer::Out(range.blocks * bl)
            }
            ScsiCommand::PreFetch { range, .. } => {
                range_ok(&range)?;
                Transfer::None
            }
            ScsiCommand::PersistentReserveOut {
                parameter_list_length,
                ..
            } => {
                // Only the basic 24-byte list is accepted (no SPEC_I_PT); refusing any other
                // length here keeps a bogus length from sizing a buffer.
                if parameter_list_length != scsi::reservation::PR_OUT_BASIC_LEN {
                    return Err(Sense::illegal_request(asc::PARAMETER_LIST_LENGTH_ERROR).into());
                }
                Transfer::Out(parameter_list_length)
            }
            ScsiCommand::CompareAndWrite { range } => {
                if range.blocks > MAX_COMPARE_AND_WRITE_BLOCKS {
                    return Err(Sense::invalid_field_in_cdb(13, None).into());
                }
                range_ok(&range)?;
                Transfer::Out(2 * range.blocks * bl)
            }
            ScsiCommand::GetLbaStatus { lba, .. } => {
                if lba >= total {
                    return Err(Sense::lba_out_of_range().into());
                }
                Transfer::None
            }
            ScsiCommand::ReportLuns {
                select_report,
                allocation_length,
            } => {
                if allocation_length < 16 {
                    return Err(Sense::invalid_field_in_cdb(6, None).into());
                }
                if !matches!(select_report, 0..=2 | 0x10..=0x12) {
                    return Err(Sense::invalid_field_in_cdb(2, None).into());
                }
                Transfer::None
            }
            _ => Transfer::None,
        };
        Ok((cmd, transfer))
    }

    fn check_transfer_len(&self, cdb: &[u8; 16], blocks: u32) -> Result<(), Sense> {
        if blocks > self.max_transfer_blocks() {
            let byte = match scsi::cdb_len(cdb[0]) {
                6 => 4,
                10 => 7,
                12 => 6,
                _ => 10,
            };
            return Err(Sense::invalid_field_in_cdb(byte, None));
        }
        Ok(())
    }

    /// Runs a prepared command sent through `nexus`. `data_out` holds exactly the bytes
    /// [`Transfer::Out`] asked for. Blocking.
    pub fn execute(&self, nexus: &Nexus, lun: u64, cmd: &ScsiCommand, data_out: &[u8]) -> Outcome {
        let bl = self.block_len();
        match *cmd {
            ScsiCommand::TestUnitReady | ScsiCommand::PreFetch { .. } => {
                // PRE-FETCH: the backend reads with O_DIRECT and keeps no cache to fill, so GOOD
                // (not CONDITION MET) is the answer SBC-3 §5.9 gives for "no room in the cache".
                Ok(None)
            }
            ScsiCommand::Reserve6 => {
                self.reservations.reserve6(nexus)?;
                Ok(None)
            }
            ScsiCommand::Release6 => {
                self.reservations.release6(nexus);
                Ok(None)
            }
            ScsiCommand::PersistentReserveIn {
                service_action,
                allocation_length,
            } => {
                let data = self.reservations.persistent_in(service_action)?;
                Ok(Some(Payload::Heap(truncate_to(data, allocation_length))))
            }
            ScsiCommand::PersistentReserveOut {
                service_action,
                scope,
                pr_type,
                ..
            } => {
                self.reservations.persistent_out(
                    nexus,
                    service_action,
                    scope,
                    pr_type,
                    data_out,
                )?;
                Ok(None)
            }
            ScsiCommand::ReportSupportedOpcodes {
                timeouts,
                options,
                opcode,
                service_action,
                allocation_length,
            } => {
                let data = if options == 0 {
                    supported::all_commands(timeouts)
                } else {
                    supported::one_command(options, opcode, service_action, timeouts)?
                };
                Ok(Some(Payload::Heap(truncate_to(data, allocation_length))))
            }
            ScsiCommand::WriteAndVerify { range, byte_check } => {
                self.write_and_verify(range, byte_check, data_out)
            }
            ScsiCommand::OrWrite(range) => self.or_write(range, data_out),
            ScsiCommand::RequestSense {
                descriptor,
                allocation_length,
            } => {
                // Sense is delivered with each response (autosense), so nothing is pending: NO
                // SENSE, or LOGICAL UNIT NOT SUPPORTED for a LUN that does not exist (SPC-4 §6.39).
                let sense = if lun == DISK_LUN {
                    Sense::new(SenseKey::NoSense, asc::NO_ADDITIONAL_SENSE)
                } else {
                    Sense::illegal_request(asc::LOGICAL_UNIT_NOT_SUPPORTED)
                };
                let data = if descriptor {
                    vec![0x72, sense.key as u8, sense.asc, sense.ascq, 0, 0, 0, 0]
                } else {
                    sense.to_fixed().to_vec()
                };
                Ok(Some(Payload::Heap(truncate_to(data, allocation_length))))
            }
            ScsiCommand::Inquiry {
                evpd,
                page_code,
                allocation_length,
            } => {
                let data = if lun != DISK_LUN {
                    // Peripheral qualifier 3: no logical unit at this LUN (SPC-4 §6.6.2).
                    if evpd {
                        return Err(Sense::illegal_request(asc::LOGICAL_UNIT_NOT_SUPPORTED).into());
                    }
                    let mut d = self.standard_inquiry();
                    d[0] = 0x7f;
                    d
                } else if evpd {
                    self.vpd(page_code)?
                } else {
                    self.standard_inquiry()
                };
                Ok(Some(Payload::Heap(truncate_to(data, allocation_length))))
            }
            ScsiCommand::ModeSense {
                ten,
                disable_block_descriptors,
                page_control,
                page_code,
                subpage_code,
                allocation_length,
            } => {
                let data = self.mode_sense(
                    ten,
                    disable_block_descriptors,
                    page_control,
                    page_code,
                    subpage_code,
                )?;
                Ok(Some(Payload::Heap(truncate_to(data, allocation_length))))
            }
            ScsiCommand::ReadCapacity10 => Ok(Some(Payload::Heap(
                self.capacity().to_read_capacity_10().to_vec(),
            ))),
            ScsiCommand::ReadCapacity16 { allocation_length } => {
                Ok(Some(Payload::Heap(truncate_to(
                    self.capacity().to_read_capacity_16().to_vec(),
                    allocation_length,
                ))))
            }
            ScsiCommand::GetLbaStatus {
                lba,
                allocation_length,
            } => {
                // One descriptor for the extent at `lba` (SBC-3 §5.16.2): 0 mapped, 1 deallocated.
                let total = self.backend.blocks();
                let (mapped, len) = self.backend.extent_at(lba * bl, total * bl);
                let blocks = (len / bl).clamp(1, total - lba).min(u64::from(u32::MAX)) as u32;
                let mut d = vec![0u8; 24];
                d[0..4].copy_from_slice(&20u32.to_be_bytes());
                d[8..16].copy_from_slice(&lba.to_be_bytes());
                d[16..20].copy_from_slice(&blocks.to_be_bytes());
                d[20] = if mapped { 0 } else { 1 };
                Ok(Some(Payload::Heap(truncate_to(d, allocation_length))))
            }
            ScsiCommand::ReportLuns {
                select_report,
                allocation_length,
            } => {
                // Only LUN 1 exists; select report 1 and 0x10-0x12 ask for well-known or
                // administrative LUNs, of which there are none.
                let luns: &[u64] = if matches!(select_report, 0 | 2) {
                    &[DISK_LUN]
                } else {
                    &[]
                };
                let mut d = Vec::with_capacity(8 + 8 * luns.len());
                d.extend_from_slice(&((8 * luns.len()) as u32).to_be_bytes());
                d.extend_from_slice(&[0; 4]);
                for lun in luns {
                    // Peripheral device addressing, single level (SAM-5 §4.7.7).
                    let mut e = [0u8; 8];
                    e[1] = *lun as u8;
                    d.extend_from_slice(&e);
                }
                Ok(Some(Payload::Heap(truncate_to(d, allocation_length))))
            }
            ScsiCommand::Read(r) => {
                let len = usize::try_from(u64::from(r.blocks) * bl).map_err(|_| internal())?;
                let mut buf = AlignedBuf::zeroed(len);
                if len > 0 {
                    self.backend
                        .read_at(&mut buf, r.lba * bl)
                        .map_err(|e| io_sense(e, asc::UNRECOVERED_READ_ERROR))?;
                }
                Ok(Some(Payload::Disk(buf)))
            }
            ScsiCommand::Write(r) => {
                let len = usize::try_from(u64::from(r.blocks) * bl).map_err(|_| internal())?;
                // The connection may hold more (a residual overflow of the initiator's buffer).
                let data_out = data_out.get(..len).ok_or_else(internal)?;
                if !data_out.is_empty() {
                    self.write_blocks(data_out, r.lba, r.fua)?;
                }
                Ok(None)
            }
            ScsiCommand::Verify { range, byte_check } => {
                if byte_check == 0 || range.blocks == 0 {
                    return Ok(None);
                }
                let len = usize::try_from(u64::from(range.blocks) * bl).map_err(|_| internal())?;
                let mut buf = AlignedBuf::zeroed(len);
                self.backend
                    .read_at(&mut buf, range.lba * bl)
                    .map_err(|e| io_sense(e, asc::UNRECOVERED_READ_ERROR))?;
                let bl = bl as usize;
                let mismatch = if byte_check == 1 {
                    buf.iter().zip(data_out).position(|(a, b)| a != b)
                } else {
                    buf.chunks(bl).enumerate().find_map(|(i, block)| {
                        block
                            .iter()
                            .zip(data_out)
                            .position(|(a, b)| a != b)
                            .map(|p| i * bl + p)
                    })
                };
                match mismatch {
                    None => Ok(None),
                    Some(offset) => Err(miscompare(offset).into()),
                }
            }
            ScsiCommand::WriteSame {
                range,
                unmap,
                no_data_out,
            } => {
                let zero_block = vec![0u8; bl as usize];
                let pattern: &[u8] = if no_data_out { &zero_block } else { data_out };
                let offset = range.lba * bl;
                let len = u64::from(range.blocks) * bl;
                // Unmapped blocks read as zeros (LBPRZ=1), so only a zero pattern may be unmapped.
                let result = if unmap && pattern.iter().all(|&b| b == 0) {
                    self.backend.discard(offset, len)
                } else {
                    self.backend.write_pattern(offset, len, pattern)
                };
                result.map_err(|e| io_sense(e, asc::WRITE_ERROR))?;
                Ok(None)
            }
            ScsiCommand::Unmap { .. } => {
                for (lba, blocks) in self.unmap_descriptors(data_out)? {
                    self.backend
                        .discard(lba * bl, blocks * bl)
                        .map_err(|e| io_sense(e, asc::WRITE_ERROR))?;
                }
                Ok(None)
            }
            ScsiCommand::CompareAndWrite { range } => {
                if range.blocks == 0 {
                    return Ok(None);
                }
                let len = usize::try_from(u64::from(range.blocks) * bl).map_err(|_| internal())?;
                let (verify, write) = data_out.get(..2 * len).ok_or_else(internal)?.split_at(len);
                let _atomic = self
                    .compare_and_write
                    .lock()
                    .unwrap_or_else(std::sync::PoisonError::into_inner);
                let mut current = AlignedBuf::zeroed(len);
                self.backend
                    .read_at(&mut current, range.lba * bl)
                    .map_err(|e| io_sense(e, asc::UNRECOVERED_READ_ERROR))?;
                if let Some(offset) = current.iter().zip(verify).position(|(a, b)| a != b) {
                    return Err(miscompare(offset).into());
                }
                let mut aligned = AlignedBuf::zeroed(len);
                aligned.copy_from_slice(write);
                self.write_blocks(&aligned, range.lba, range.fua)?;
                Ok(None)
            }
            ScsiCommand::SynchronizeCache { .. } => {
                self.backend
                    .sync()
                    .map_err(|e| io_sense(e, asc::WRITE_ERROR))?;
                Ok(None)
            }
        }
    }

    /// WRITE AND VERIFY: writes, flushes, and reads the blocks back from the medium; with BYTCHK
    /// the read-back must equal the data-out (SBC-3 §5.41).
    fn write_and_verify(&self, range: BlockRange, byte_check: bool, data_out: &[u8]) -> Outcome {
        let bl = self.block_len();
        let len = usize::try_from(u64::from(range.blocks) * bl).map_err(|_| internal())?;
        if len == 0 {
            return Ok(None);
        }
        let data_out = data_out.get(..len).ok_or_else(internal)?;
        let mut aligned = AlignedBuf::zeroed(len);
        aligned.copy_from_slice(data_out);
        // Verified means read back from the medium: the data goes through first (as FUA).
        self.write_blocks(&aligned, range.lba, true)?;
        let mut back = AlignedBuf::zeroed(len);
        self.backend
            .read_at(&mut back, range.lba * bl)
            .map_err(|e| io_sense(e, asc::UNRECOVERED_READ_ERROR))?;
        if byte_check {
            if let Some(offset) = back.iter().zip(data_out).position(|(a, b)| a != b) {
                return Err(miscompare(offset).into());
            }
        }
        Ok(None)
    }

    /// ORWRITE: each block becomes itself OR the data-out, atomically with respect to COMPARE
    /// AND WRITE and other ORWRITEs (SBC-3 §5.8).
    fn or_write(&self, range: BlockRange, data_out: &[u8]) -> Outcome {
        let bl = self.block_len();
        let len = usize::try_from(u64::from(range.blocks) * bl).map_err(|_| internal())?;
        if len == 0 {
            return Ok(None);
        }
        let data_out = data_out.get(..len).ok_or_else(internal)?;
        let _atomic = self
            .compare_and_write
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let mut blocks = AlignedBuf::zeroed(len);
        self.backend
            .read_at(&mut blocks, range.lba * bl)
            .map_err(|e| io_sense(e, asc::UNRECOVERED_READ_ERROR))?;
        for (b, d) in blocks.iter_mut().zip(data_out) {
            *b |= d;
        }
        self.write_blocks(&blocks, range.lba, range.fua)?;
        Ok(None)
    }

    /// Parses and checks an UNMAP parameter list (SBC-3 §5.28.2).
    fn unmap_descriptors(&self, data: &[u8]) -> Result<Vec<(u64, u64)>, Sense> {
        if data.is_empty() {
            return Ok(Vec::new());
        }
        if data.len() < 8 {
            return Err(Sense::illegal_request(asc::PARAMETER_LIST_LENGTH_ERROR));
        }
        let desc_len = usize::from(u16::from_be_bytes([data[2], data[3]]));
        let avail = (data.len() - 8).min(desc_len) / 16;
        if avail as u32 > MAX_UNMAP_DESCRIPTORS {
            return Err(Sense::invalid_field_in_parameter_list(2));
        }
        let total = self.backend.blocks();
        let mut out = Vec::with_capacity(avail);
        let mut count = 0u64;
        for i in 0..avail {
            let d = &data[8 + i * 16..8 + (i + 1) * 16];
            let mut lba = [0u8; 8];
            lba.copy_from_slice(&d[0..8]);
            let lba = u64::from_be_bytes(lba);
            let blocks = u64::from(u32::from_be_bytes([d[8], d[9], d[10], d[11]]));
            if lba.checked_add(blocks).is_none_or(|end| end > total) {
                return Err(Sense::lba_out_of_range());
            }
            count += blocks;
            if count > u64::from(MAX_UNMAP_BLOCKS) {
                return Err(Sense::invalid_field_in_parameter_list(
                    (8 + i * 16 + 8) as u16,
                ));
            }
            if blocks > 0 {
                out.push((lba, blocks));
            }
        }
        Ok(out)
    }
}

/// MISCOMPARE DURING VERIFY OPERATION with the offset of the first differing byte.
fn miscompare(offset: usize) -> Sense {
    Sense {
        information: Some(offset as u64),
        ..Sense::new(SenseKey::Miscompare, asc::MISCOMPARE_DURING_VERIFY)
    }
}

fn internal() -> Sense {
    Sense::new(SenseKey::HardwareError, asc::INTERNAL_TARGET_FAILURE)
}

fn io_sense(err: std::io::Error, code: (u8, u8)) -> Sense {
    tracing::error!(error = %err, "backing store I/O failed");
    Sense::new(SenseKey::MediumError, code)
}

#[cfg(test)]
mod tests;
