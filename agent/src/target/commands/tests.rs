//! Unit tests of the SCSI command layer: one LUN on a temp file, CDBs built with `scsi::build`.

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

fn nx() -> Nexus {
    Nexus {
        initiator: "iqn.2026-12.test:one".into(),
        isid: [0x80, 0, 0, 0, 0, 1],
    }
}

/// The sense data of a CHECK CONDITION.
fn check(f: Failure) -> Sense {
    *f.sense().expect("CHECK CONDITION")
}

fn run(l: &Lun, cdb: [u8; 16], data: &[u8]) -> Outcome {
    let (cmd, _) = l.prepare(&nx(), DISK_LUN, &cdb)?;
    l.execute(&nx(), DISK_LUN, &cmd, data)
}

#[test]
fn write_then_read_round_trips() {
    let (_d, l) = lun(64);
    let data = vec![0x5au8; 1024];
    let (cmd, t) = l
        .prepare(&nx(), DISK_LUN, &build::write_16(3, 2, false))
        .expect("prepare");
    assert_eq!(t, Transfer::Out(1024));
    l.execute(&nx(), DISK_LUN, &cmd, &data).expect("write");
    let out = run(&l, build::read_16(3, 2), &[])
        .expect("read")
        .expect("data");
    assert_eq!(out.as_slice(), &data[..]);
}

#[test]
fn out_of_range_read_is_lba_out_of_range() {
    let (_d, l) = lun(64);
    let sense = check(
        l.prepare(&nx(), DISK_LUN, &build::read_16(63, 2))
            .expect_err("beyond the end"),
    );
    assert_eq!((sense.asc, sense.ascq), asc::LBA_OUT_OF_RANGE);
}

#[test]
fn other_luns_are_not_supported() {
    let (_d, l) = lun(64);
    let sense = check(
        l.prepare(&nx(), 0, &build::read_16(0, 1))
            .expect_err("lun 0 has no disk"),
    );
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
    let sense = check(run(&l, build::inquiry(Some(0x42), 255), &[]).expect_err("unknown page"));
    assert_eq!((sense.asc, sense.ascq), asc::INVALID_FIELD_IN_CDB);
}

#[test]
fn compare_and_write_writes_only_on_match() {
    let (_d, l) = lun(64);
    let mut cdb = [0u8; 16];
    cdb[0] = scsi::opcode::COMPARE_AND_WRITE;
    cdb[9] = 4; // LBA 4
    cdb[13] = 1;
    let (cmd, t) = l.prepare(&nx(), DISK_LUN, &cdb).expect("prepare");
    assert_eq!(t, Transfer::Out(1024));
    let mut data = vec![0u8; 1024];
    data[512..].fill(0x77);
    l.execute(&nx(), DISK_LUN, &cmd, &data)
        .expect("zeros match");
    let sense = check(
        l.execute(&nx(), DISK_LUN, &cmd, &data)
            .expect_err("block now holds 0x77"),
    );
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
        .prepare(&nx(), DISK_LUN, &build::write_16(8, 2, false))
        .expect("prepare");
    l.execute(&nx(), DISK_LUN, &w, &[0xee; 1024])
        .expect("write");
    let mut list = vec![0u8; 24];
    list[3] = 16;
    list[8 + 7] = 8; // LBA 8
    list[8 + 11] = 2; // 2 blocks
    let mut cdb = [0u8; 16];
    cdb[0] = scsi::opcode::UNMAP;
    cdb[8] = 24;
    let (u, t) = l.prepare(&nx(), DISK_LUN, &cdb).expect("prepare unmap");
    assert_eq!(t, Transfer::Out(24));
    l.execute(&nx(), DISK_LUN, &u, &list).expect("unmap");
    let out = run(&l, build::read_16(8, 2), &[])
        .expect("read")
        .expect("data");
    assert!(out.as_slice().iter().all(|&b| b == 0));
    list[8 + 7] = 63; // LBA 63 + 2 blocks runs past the end
    let sense = check(
        l.execute(&nx(), DISK_LUN, &u, &list)
            .expect_err("beyond the end"),
    );
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
        if let Ok((cmd, Transfer::None)) = l.prepare(&nx(), DISK_LUN, &cdb) {
            let _ = l.execute(&nx(), DISK_LUN, &cmd, &[]);
        }
    }

    /// Every supported opcode, with fields biased towards zero and small values so that
    /// ranges often fit the 8-block LUN, runs with the data-out it asked for.
    #[test]
    fn supported_commands_run_without_panic(
        which in 0..supported::SUPPORTED_COMMANDS.len(),
        rest in proptest::collection::vec(
            proptest::prop_oneof![
                proptest::strategy::Just(0u8),
                0u8..9,
                proptest::prelude::any::<u8>()
            ],
            15,
        ),
        fill in proptest::prelude::any::<u8>(),
    ) {
        let (_d, l) = lun(8);
        let c = &supported::SUPPORTED_COMMANDS[which];
        let mut cdb = [0u8; 16];
        cdb[0] = c.opcode;
        cdb[1..].copy_from_slice(&rest);
        if let Some(sa) = c.service_action {
            cdb[1] = (cdb[1] & 0xe0) | sa as u8;
        }
        match l.prepare(&nx(), DISK_LUN, &cdb) {
            Ok((cmd, Transfer::None)) => {
                let _ = l.execute(&nx(), DISK_LUN, &cmd, &[]);
            }
            Ok((cmd, Transfer::Out(n))) if n <= 1 << 16 => {
                let _ = l.execute(&nx(), DISK_LUN, &cmd, &vec![fill; n as usize]);
            }
            _ => {}
        }
    }
}

fn other() -> Nexus {
    Nexus {
        initiator: "iqn.2026-12.test:two".into(),
        isid: [0x80, 0, 0, 0, 0, 2],
    }
}

fn cdb(bytes: &[u8]) -> [u8; 16] {
    let mut c = [0u8; 16];
    c[..bytes.len()].copy_from_slice(bytes);
    c
}

#[test]
fn write_same_of_zero_blocks_runs_to_the_end_within_the_limit() {
    let (_d, l) = lun(64);
    l.execute(
        &nx(),
        DISK_LUN,
        &l.prepare(&nx(), DISK_LUN, &build::write_16(60, 4, false))
            .expect("prepare")
            .0,
        &[0x11; 2048],
    )
    .expect("write");
    // WRITE SAME (10) at LBA 60, zero blocks: blocks 60..64 get the pattern.
    let ws = cdb(&[scsi::opcode::WRITE_SAME_10, 0, 0, 0, 0, 60, 0, 0, 0, 0]);
    let (cmd, t) = l.prepare(&nx(), DISK_LUN, &ws).expect("prepare");
    assert_eq!(t, Transfer::Out(512));
    assert!(matches!(cmd, ScsiCommand::WriteSame { range, .. } if range.blocks == 4));
    l.execute(&nx(), DISK_LUN, &cmd, &[0x22; 512])
        .expect("write same");
    let out = run(&l, build::read_16(60, 4), &[])
        .expect("read")
        .expect("data");
    assert!(out.as_slice().iter().all(|&b| b == 0x22));
    // One past the end: LBA OUT OF RANGE, not "zero blocks".
    let past = cdb(&[scsi::opcode::WRITE_SAME_10, 0, 0, 0, 0, 65, 0, 0, 0, 0]);
    let sense = check(l.prepare(&nx(), DISK_LUN, &past).expect_err("past the end"));
    assert_eq!((sense.asc, sense.ascq), asc::LBA_OUT_OF_RANGE);
}

#[test]
fn write_same_to_the_end_beyond_the_limit_is_an_invalid_field() {
    let (_d, l) = lun(MAX_WRITE_SAME_BLOCKS + 8);
    let ws = cdb(&[scsi::opcode::WRITE_SAME_10]);
    let sense = check(l.prepare(&nx(), DISK_LUN, &ws).expect_err("too long"));
    assert_eq!((sense.asc, sense.ascq), asc::INVALID_FIELD_IN_CDB);
    assert_eq!(sense.field_pointer.map(|f| f.byte), Some(7));
}

#[test]
fn orwrite_ors_and_write_and_verify_writes() {
    let (_d, l) = lun(64);
    let mut wv = cdb(&[scsi::opcode::WRITE_AND_VERIFY_16, 0x02]);
    wv[9] = 2;
    wv[13] = 1;
    let (cmd, t) = l.prepare(&nx(), DISK_LUN, &wv).expect("prepare");
    assert_eq!(t, Transfer::Out(512));
    l.execute(&nx(), DISK_LUN, &cmd, &[0x0f; 512])
        .expect("write and verify");
    let mut or = cdb(&[scsi::opcode::ORWRITE_16]);
    or[9] = 2;
    or[13] = 1;
    let (cmd, t) = l.prepare(&nx(), DISK_LUN, &or).expect("prepare");
    assert_eq!(t, Transfer::Out(512));
    l.execute(&nx(), DISK_LUN, &cmd, &[0xf0; 512])
        .expect("orwrite");
    let out = run(&l, build::read_16(2, 1), &[])
        .expect("read")
        .expect("data");
    assert!(out.as_slice().iter().all(|&b| b == 0xff));
    or[9] = 64;
    let sense = check(l.prepare(&nx(), DISK_LUN, &or).expect_err("beyond the end"));
    assert_eq!((sense.asc, sense.ascq), asc::LBA_OUT_OF_RANGE);
}

#[test]
fn prefetch_checks_the_range_only() {
    let (_d, l) = lun(64);
    let ok = cdb(&[scsi::opcode::PRE_FETCH_10, 0, 0, 0, 0, 60, 0, 0, 4, 0]);
    assert!(matches!(run(&l, ok, &[]), Ok(None)));
    let past = cdb(&[scsi::opcode::PRE_FETCH_10, 0, 0, 0, 0, 61, 0, 0, 4, 0]);
    let sense = check(run(&l, past, &[]).expect_err("beyond the end"));
    assert_eq!((sense.asc, sense.ascq), asc::LBA_OUT_OF_RANGE);
}

#[test]
fn persistent_reserve_out_needs_the_24_byte_list() {
    let (_d, l) = lun(8);
    for len in [0u8, 23, 25, 32] {
        let c = cdb(&[
            scsi::opcode::PERSISTENT_RESERVE_OUT,
            0,
            0,
            0,
            0,
            0,
            0,
            0,
            len,
        ]);
        let sense = check(l.prepare(&nx(), DISK_LUN, &c).expect_err("bad length"));
        assert_eq!((sense.asc, sense.ascq), asc::PARAMETER_LIST_LENGTH_ERROR);
    }
}

#[test]
fn reservations_conflict_through_the_lun() {
    let (_d, l) = lun(8);
    run(&l, cdb(&[scsi::opcode::RESERVE_6]), &[]).expect("reserve");
    let read = build::read_16(0, 1);
    assert_eq!(
        l.prepare(&other(), DISK_LUN, &read).expect_err("reserved"),
        Failure::ReservationConflict
    );
    l.prepare(&other(), DISK_LUN, &build::inquiry(None, 96))
        .expect("INQUIRY passes a reservation");
    l.nexus_lost(&nx());
    l.prepare(&other(), DISK_LUN, &read)
        .expect("released with the nexus");
    // Register through PERSISTENT RESERVE OUT, then read the key back.
    let mut list = [0u8; 24];
    list[15] = 0x42;
    let reg = cdb(&[
        scsi::opcode::PERSISTENT_RESERVE_OUT,
        0x06,
        0,
        0,
        0,
        0,
        0,
        0,
        24,
    ]);
    let (cmd, t) = l.prepare(&nx(), DISK_LUN, &reg).expect("prepare");
    assert_eq!(t, Transfer::Out(24));
    l.execute(&nx(), DISK_LUN, &cmd, &list).expect("register");
    let keys = cdb(&[scsi::opcode::PERSISTENT_RESERVE_IN, 0, 0, 0, 0, 0, 0, 0, 64]);
    let out = run(&l, keys, &[]).expect("read keys").expect("data");
    assert_eq!(
        out.as_slice(),
        &[0, 0, 0, 1, 0, 0, 0, 8, 0, 0, 0, 0, 0, 0, 0, 0x42]
    );
}

#[test]
fn report_supported_opcodes_answers_all_and_one() {
    let (_d, l) = lun(8);
    let all = cdb(&[
        scsi::opcode::MAINTENANCE_IN,
        0x0c,
        0,
        0,
        0,
        0,
        0,
        0,
        0x10,
        0,
    ]);
    let out = run(&l, all, &[]).expect("all").expect("data");
    assert_eq!(
        out.as_slice().len(),
        4 + 8 * supported::SUPPORTED_COMMANDS.len()
    );
    let one = cdb(&[
        scsi::opcode::MAINTENANCE_IN,
        0x0c,
        1,
        0x2a,
        0,
        0,
        0,
        0,
        1,
        0,
    ]);
    let out = run(&l, one, &[]).expect("one").expect("data");
    assert_eq!(out.as_slice()[4], 0x2a);
    let wrong = cdb(&[
        scsi::opcode::MAINTENANCE_IN,
        0x0c,
        2,
        0x2a,
        0,
        0,
        0,
        0,
        1,
        0,
    ]);
    let sense = check(run(&l, wrong, &[]).expect_err("WRITE (10) has no service actions"));
    assert_eq!((sense.asc, sense.ascq), asc::INVALID_FIELD_IN_CDB);
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
