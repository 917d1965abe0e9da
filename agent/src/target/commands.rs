//! The SCSI command engine of the target: what each CDB does to the backing store and which
//! data or sense comes back. No iSCSI here; the connection layer moves the bytes.
//!
//! Execution is blocking (pread/pwrite/fdatasync): the connection runs it on the blocking pool.

use std::sync::Arc;

use sha2::{Digest, Sha256};
use vmdeploy_shared::iscsi::scsi::{
    self, asc, designation_descriptor, truncate_to, vpd, vpd_page, BlockRange, Capacity,
    ScsiCommand, Sense, SenseKey,
};

use super::backend::{AlignedBuf, BlockBackend};

/// The LUN number the disk is served as (Ironic uses LUN 1, reference ironic-protocols.md §2.2).
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
}

impl Payload {
    /// The bytes.
    pub fn as_slice(&self) -> &[u8] {
        match self {
            Payload::Disk(b) => b,
            Payload::Heap(v) => v,
        }
    }
}

/// Result of one command: GOOD with optional data, or CHECK CONDITION with sense.
pub type Outcome = Result<Option<Payload>, Sense>;

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
    /// Serialises COMPARE AND WRITE so the compare and the write are atomic with respect to each
    /// other (SBC-3 §5.2).
    compare_and_write: std::sync::Mutex<()>,
}

impl Lun {
    /// A LUN over an opened backend.
    pub fn new(backend: Arc<BlockBackend>, identity: Identity) -> Self {
        Self {
            backend,
            identity,
            compare_and_write: std::sync::Mutex::new(()),
        }
    }

    /// The backing store.
    pub fn backend(&self) -> &Arc<BlockBackend> {
        &self.backend
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

    fn max_transfer_blocks(&self) -> u32 {
        MAX_TRANSFER_BYTES / self.backend.block_len()
    }

    /// Decodes a CDB for `lun` and checks everything that can be checked before data moves
    /// (LUN, ranges, limits). Returns the command and the data-out it needs.
    pub fn prepare(&self, lun: u64, cdb: &[u8; 16]) -> Result<(ScsiCommand, Transfer), Sense> {
        let cmd = ScsiCommand::parse(cdb)?;
        if lun != DISK_LUN
            && !matches!(
                cmd,
                ScsiCommand::Inquiry { .. }
                    | ScsiCommand::ReportLuns { .. }
                    | ScsiCommand::RequestSense { .. }
            )
        {
            return Err(Sense::illegal_request(asc::LOGICAL_UNIT_NOT_SUPPORTED));
        }
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
                range, no_data_out, ..
            } => {
                // WSNZ=1 in Block Limits: zero blocks is not "to the end of the medium".
                if range.blocks == 0 || u64::from(range.blocks) > MAX_WRITE_SAME_BLOCKS {
                    let byte = if cdb[0] == scsi::opcode::WRITE_SAME_10 {
                        7
                    } else {
                        10
                    };
                    return Err(Sense::invalid_field_in_cdb(byte, None));
                }
                range_ok(&range)?;
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
            ScsiCommand::CompareAndWrite { range } => {
                if range.blocks > MAX_COMPARE_AND_WRITE_BLOCKS {
                    return Err(Sense::invalid_field_in_cdb(13, None));
                }
                range_ok(&range)?;
                Transfer::Out(2 * range.blocks * bl)
            }
            ScsiCommand::GetLbaStatus { lba, .. } => {
                if lba >= total {
                    return Err(Sense::lba_out_of_range());
                }
                Transfer::None
            }
            ScsiCommand::ReportLuns {
                select_report,
                allocation_length,
            } => {
                if allocation_length < 16 {
                    return Err(Sense::invalid_field_in_cdb(6, None));
                }
                if !matches!(select_report, 0..=2 | 0x10..=0x12) {
                    return Err(Sense::invalid_field_in_cdb(2, None));
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

    /// Runs a prepared command. `data_out` holds exactly the bytes [`Transfer::Out`] asked for.
    /// Blocking.
    pub fn execute(&self, lun: u64, cmd: &ScsiCommand, data_out: &[u8]) -> Outcome {
        let bl = self.block_len();
        match *cmd {
            ScsiCommand::TestUnitReady => Ok(None),
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
                        return Err(Sense::illegal_request(asc::LOGICAL_UNIT_NOT_SUPPORTED));
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
                    self.backend
                        .write_at(data_out, r.lba * bl)
                        .map_err(|e| io_sense(e, asc::WRITE_ERROR))?;
                    if r.fua {
                        self.backend
                            .sync()
                            .map_err(|e| io_sense(e, asc::WRITE_ERROR))?;
                    }
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
                    Some(offset) => Err(Sense {
                        information: Some(offset as u64),
                        ..Sense::new(SenseKey::Miscompare, asc::MISCOMPARE_DURING_VERIFY)
                    }),
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
                    return Err(Sense {
                        information: Some(offset as u64),
                        ..Sense::new(SenseKey::Miscompare, asc::MISCOMPARE_DURING_VERIFY)
                    });
                }
                let mut aligned = AlignedBuf::zeroed(len);
                aligned.copy_from_slice(write);
                self.backend
                    .write_at(&aligned, range.lba * bl)
                    .map_err(|e| io_sense(e, asc::WRITE_ERROR))?;
                if range.fua {
                    self.backend
                        .sync()
                        .map_err(|e| io_sense(e, asc::WRITE_ERROR))?;
                }
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

    fn standard_inquiry(&self) -> Vec<u8> {
        let mut d = vec![0u8; 66];
        d[0] = 0x00; // connected direct-access block device
        d[1] = 0x00; // not removable
        d[2] = 0x06; // SPC-4
        d[3] = 0x12; // HISUP, response data format 2
        d[4] = (d.len() - 5) as u8;
        d[7] = 0x02; // CMDQUE
        d[8..16].copy_from_slice(b"VMDEPLOY");
        d[16..32].copy_from_slice(b"AGENT DISK      ");
        d[32..36].copy_from_slice(b"0001");
        // Version descriptors (SPC-4 table 29): SAM-5, iSCSI, SPC-4, SBC-3.
        for (i, v) in [0x00a0u16, 0x0960, 0x0460, 0x04c0].iter().enumerate() {
            d[58 + 2 * i..60 + 2 * i].copy_from_slice(&v.to_be_bytes());
        }
        d
    }

    fn vpd(&self, page: u8) -> Result<Vec<u8>, Sense> {
        let bl = self.backend.block_len();
        Ok(match page {
            vpd::SUPPORTED_PAGES => vpd_page(
                page,
                &[
                    vpd::SUPPORTED_PAGES,
                    vpd::UNIT_SERIAL_NUMBER,
                    vpd::DEVICE_IDENTIFICATION,
                    vpd::BLOCK_LIMITS,
                    vpd::BLOCK_DEVICE_CHARACTERISTICS,
                    vpd::LOGICAL_BLOCK_PROVISIONING,
                ],
            ),
            vpd::UNIT_SERIAL_NUMBER => vpd_page(page, self.identity.serial.as_bytes()),
            vpd::DEVICE_IDENTIFICATION => {
                let mut body = Vec::new();
                // NAA, binary, associated with the logical unit.
                body.extend(designation_descriptor(None, 1, 0, 3, &self.identity.naa));
                // T10 vendor ID, ASCII: vendor then serial.
                let t10 = format!("VMDEPLOY{}", self.identity.serial);
                body.extend(designation_descriptor(None, 2, 0, 1, t10.as_bytes()));
                // SCSI name string of the target device, UTF-8, NUL-padded to a multiple of 4,
                // protocol identifier 5 = iSCSI (SPC-4 §7.8.6.11).
                let mut name = self.identity.target_name.as_bytes().to_vec();
                name.truncate(251);
                name.push(0);
                while !name.len().is_multiple_of(4) {
                    name.push(0);
                }
                body.extend(designation_descriptor(Some(5), 3, 2, 8, &name));
                // Relative target port 1 and target port group 1, associated with the port.
                body.extend(designation_descriptor(Some(5), 1, 1, 4, &[0, 0, 0, 1]));
                body.extend(designation_descriptor(Some(5), 1, 1, 5, &[0, 0, 0, 1]));
                vpd_page(page, &body)
            }
            vpd::BLOCK_LIMITS => {
                let mut b = vec![0u8; 0x3c];
                b[0] = 0x01; // WSNZ (byte 4 of the page)
                b[1] = MAX_COMPARE_AND_WRITE_BLOCKS as u8;
                let gran = (4096 / bl).max(1) as u16;
                b[2..4].copy_from_slice(&gran.to_be_bytes());
                b[4..8].copy_from_slice(&self.max_transfer_blocks().to_be_bytes());
                b[8..12].copy_from_slice(&(OPTIMAL_TRANSFER_BYTES / bl).to_be_bytes());
                b[16..20].copy_from_slice(&MAX_UNMAP_BLOCKS.to_be_bytes());
                b[20..24].copy_from_slice(&MAX_UNMAP_DESCRIPTORS.to_be_bytes());
                b[24..28].copy_from_slice(&u32::from(gran).to_be_bytes());
                b[32..40].copy_from_slice(&MAX_WRITE_SAME_BLOCKS.to_be_bytes());
                vpd_page(page, &b)
            }
            vpd::BLOCK_DEVICE_CHARACTERISTICS => {
                let mut b = vec![0u8; 0x3c];
                b[0..2].copy_from_slice(&1u16.to_be_bytes()); // non-rotating medium
                vpd_page(page, &b)
            }
            vpd::LOGICAL_BLOCK_PROVISIONING => {
                // LBPU, LBPWS, LBPWS10, LBPRZ; provisioning type 2 (thin).
                vpd_page(page, &[0x00, 0x80 | 0x40 | 0x20 | 0x04, 0x02, 0x00])
            }
            _ => return Err(Sense::invalid_field_in_cdb(2, None)),
        })
    }

    fn mode_sense(
        &self,
        ten: bool,
        dbd: bool,
        page_control: u8,
        page_code: u8,
        subpage_code: u8,
    ) -> Result<Vec<u8>, Sense> {
        if page_control == 3 {
            return Err(Sense::illegal_request(asc::SAVING_PARAMETERS_NOT_SUPPORTED));
        }
        let changeable = page_control == 1;
        let caching = |v: &mut Vec<u8>| {
            let mut p = vec![0u8; 20];
            p[0] = 0x08;
            p[1] = 0x12;
            if !changeable {
                p[2] = 0x04; // WCE: writes may sit in the page cache until SYNCHRONIZE CACHE
            }
            v.extend(p);
        };
        let control = |v: &mut Vec<u8>| {
            let mut p = vec![0u8; 12];
            p[0] = 0x0a;
            p[1] = 0x0a;
            if !changeable {
                p[3] = 0x10; // unrestricted reordering
                p[8] = 0xff; // busy timeout period: unlimited
                p[9] = 0xff;
            }
            v.extend(p);
        };
        let informational = |v: &mut Vec<u8>| {
            let mut p = vec![0u8; 12];
            p[0] = 0x1c;
            p[1] = 0x0a;
            v.extend(p);
        };
        let mut pages = Vec::new();
        match (page_code, subpage_code) {
            (0x3f, 0x00 | 0xff) => {
                caching(&mut pages);
                control(&mut pages);
                informational(&mut pages);
            }
            (0x08, 0x00) => caching(&mut pages),
            (0x0a, 0x00) => control(&mut pages),
            (0x1c, 0x00) => informational(&mut pages),
            (_, 0x00) | (0x3f, _) => return Err(Sense::invalid_field_in_cdb(2, None)),
            _ => return Err(Sense::invalid_field_in_cdb(3, None)),
        }
        let mut block_descriptor = Vec::new();
        if !dbd {
            let blocks = u32::try_from(self.backend.blocks()).unwrap_or(u32::MAX);
            block_descriptor.extend_from_slice(&blocks.to_be_bytes());
            block_descriptor.extend_from_slice(&self.backend.block_len().to_be_bytes());
            block_descriptor[4] = 0; // density code
        }
        // Device-specific parameter: DPOFUA (SBC-3 §6.5.1), not write-protected.
        let device_specific = 0x10;
        let mut out = Vec::new();
        if ten {
            let len = (6 + block_descriptor.len() + pages.len()) as u16;
            out.extend_from_slice(&len.to_be_bytes());
            out.extend_from_slice(&[0, device_specific, 0, 0]);
            out.extend_from_slice(&(block_descriptor.len() as u16).to_be_bytes());
        } else {
            let len = u8::try_from(3 + block_descriptor.len() + pages.len()).unwrap_or(u8::MAX);
            out.extend_from_slice(&[len, 0, device_specific, block_descriptor.len() as u8]);
        }
        out.extend(block_descriptor);
        out.extend(pages);
        Ok(out)
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
mod tests {
    use super::*;
    use scsi::build;

    fn lun(blocks: u64) -> (tempfile::TempDir, Lun) {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("lun.img");
        std::fs::write(&path, vec![0u8; (blocks * 512) as usize]).expect("backing file");
        let backend = Arc::new(BlockBackend::open(&path, true).expect("open"));
        let id = Identity::derive("iqn-1234", &path);
        (dir, Lun::new(backend, id))
    }

    fn run(l: &Lun, cdb: [u8; 16], data: &[u8]) -> Outcome {
        let (cmd, _) = l.prepare(DISK_LUN, &cdb)?;
        l.execute(DISK_LUN, &cmd, data)
    }

    #[test]
    fn write_then_read_round_trips() {
        let (_d, l) = lun(64);
        let data = vec![0x5au8; 1024];
        let (cmd, t) = l
            .prepare(DISK_LUN, &build::write_16(3, 2, false))
            .expect("prepare");
        assert_eq!(t, Transfer::Out(1024));
        l.execute(DISK_LUN, &cmd, &data).expect("write");
        let out = run(&l, build::read_16(3, 2), &[])
            .expect("read")
            .expect("data");
        assert_eq!(out.as_slice(), &data[..]);
    }

    #[test]
    fn out_of_range_read_is_lba_out_of_range() {
        let (_d, l) = lun(64);
        let sense = l
            .prepare(DISK_LUN, &build::read_16(63, 2))
            .expect_err("beyond the end");
        assert_eq!((sense.asc, sense.ascq), asc::LBA_OUT_OF_RANGE);
    }

    #[test]
    fn other_luns_are_not_supported() {
        let (_d, l) = lun(64);
        let sense = l
            .prepare(0, &build::read_16(0, 1))
            .expect_err("lun 0 has no disk");
        assert_eq!((sense.asc, sense.ascq), asc::LOGICAL_UNIT_NOT_SUPPORTED);
    }

    #[test]
    fn inquiry_pages_have_their_codes() {
        let (_d, l) = lun(64);
        for page in [0x00, 0x80, 0x83, 0xb0, 0xb1, 0xb2] {
            let out = run(&l, build::inquiry(Some(page), 255), &[])
                .expect("vpd")
                .expect("data");
            assert_eq!(out.as_slice()[1], page);
        }
        let sense = run(&l, build::inquiry(Some(0x42), 255), &[]).expect_err("unknown page");
        assert_eq!((sense.asc, sense.ascq), asc::INVALID_FIELD_IN_CDB);
    }

    #[test]
    fn compare_and_write_writes_only_on_match() {
        let (_d, l) = lun(64);
        let mut cdb = [0u8; 16];
        cdb[0] = scsi::opcode::COMPARE_AND_WRITE;
        cdb[9] = 4; // LBA 4
        cdb[13] = 1;
        let (cmd, t) = l.prepare(DISK_LUN, &cdb).expect("prepare");
        assert_eq!(t, Transfer::Out(1024));
        let mut data = vec![0u8; 1024];
        data[512..].fill(0x77);
        l.execute(DISK_LUN, &cmd, &data).expect("zeros match");
        let sense = l
            .execute(DISK_LUN, &cmd, &data)
            .expect_err("block now holds 0x77");
        assert_eq!(sense.key, SenseKey::Miscompare);
        assert_eq!(sense.information, Some(0));
        let out = run(&l, build::read_16(4, 1), &[])
            .expect("read")
            .expect("data");
        assert!(out.as_slice().iter().all(|&b| b == 0x77));
    }

    #[test]
    fn unmap_reads_back_zeros_and_checks_ranges() {
        let (_d, l) = lun(64);
        let (w, _) = l
            .prepare(DISK_LUN, &build::write_16(8, 2, false))
            .expect("prepare");
        l.execute(DISK_LUN, &w, &[0xee; 1024]).expect("write");
        let mut list = vec![0u8; 24];
        list[3] = 16;
        list[8 + 7] = 8; // LBA 8
        list[8 + 11] = 2; // 2 blocks
        let mut cdb = [0u8; 16];
        cdb[0] = scsi::opcode::UNMAP;
        cdb[8] = 24;
        let (u, t) = l.prepare(DISK_LUN, &cdb).expect("prepare unmap");
        assert_eq!(t, Transfer::Out(24));
        l.execute(DISK_LUN, &u, &list).expect("unmap");
        let out = run(&l, build::read_16(8, 2), &[])
            .expect("read")
            .expect("data");
        assert!(out.as_slice().iter().all(|&b| b == 0));
        list[8 + 7] = 63; // LBA 63 + 2 blocks runs past the end
        let sense = l.execute(DISK_LUN, &u, &list).expect_err("beyond the end");
        assert_eq!((sense.asc, sense.ascq), asc::LBA_OUT_OF_RANGE);
    }

    proptest::proptest! {
        #[test]
        fn unmap_list_parse_never_panics(data in proptest::collection::vec(proptest::prelude::any::<u8>(), 0..200)) {
            let (_d, l) = lun(8);
            let _ = l.unmap_descriptors(&data);
        }

        #[test]
        fn any_cdb_prepares_without_panic(cdb in proptest::array::uniform16(proptest::prelude::any::<u8>())) {
            let (_d, l) = lun(8);
            if let Ok((cmd, Transfer::None)) = l.prepare(DISK_LUN, &cdb) {
                let _ = l.execute(DISK_LUN, &cmd, &[]);
            }
        }
    }

    #[test]
    fn capacity_reports_size() {
        let (_d, l) = lun(64);
        let out = run(&l, build::read_capacity_16(32), &[])
            .expect("rc16")
            .expect("data");
        let cap = Capacity::parse_read_capacity_16(out.as_slice()).expect("parse");
        assert_eq!((cap.blocks, cap.block_len), (64, 512));
    }
}
