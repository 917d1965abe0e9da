//! The device's self-description: standard INQUIRY data, the VPD pages (SPC-4 §7.8, SBC-3
//! §6.6) and the MODE SENSE pages (SPC-4 §7.5, SBC-3 §6.5).

use vmdeploy_shared::iscsi::scsi::{asc, designation_descriptor, vpd, vpd_page, Sense};

use super::{
    Lun, MAX_COMPARE_AND_WRITE_BLOCKS, MAX_UNMAP_BLOCKS, MAX_UNMAP_DESCRIPTORS,
    MAX_WRITE_SAME_BLOCKS, OPTIMAL_TRANSFER_BYTES,
};

impl Lun {
    pub(super) fn standard_inquiry(&self) -> Vec<u8> {
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

    pub(super) fn vpd(&self, page: u8) -> Result<Vec<u8>, Sense> {
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
                // WSNZ (byte 4 of the page) clear: WRITE SAME of zero blocks runs to the end.
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

    pub(super) fn mode_sense(
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
