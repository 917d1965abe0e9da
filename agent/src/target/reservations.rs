//! Reservations of the logical unit: SPC-2 RESERVE(6)/RELEASE(6) and SPC-4 persistent
//! reservations (PERSISTENT RESERVE IN/OUT), keyed by I_T nexus.
//!
//! What outlives what (SPC-4 §5.13, SPC-2 §5.5.1):
//! - An SPC-2 reservation belongs to one I_T nexus and ends with RELEASE(6), with the loss of that
//!   nexus (logout or a dropped connection), and with a logical unit or target reset.
//! - Persistent registrations and the persistent reservation survive nexus loss and resets; they
//!   end only through PERSISTENT RESERVE OUT. Nothing here survives the agent (APTPL is not
//!   offered), which is all a deploy needs.
//!
//! Unit attentions that SPC-4 asks for after a preempt or a release of another nexus's
//! reservation are not raised: the target has no unit attention queue.

use std::sync::Mutex;

use vmdeploy_shared::iscsi::scsi::reservation::{self, FullStatusEntry, PrOutParameters};
use vmdeploy_shared::iscsi::scsi::{asc, pr_in, pr_out, pr_type, Failure, ScsiCommand, Sense};

/// The only target port of this target: relative port 1 in target portal group 1 (the device
/// identification VPD page says the same), so an I_T nexus is named by its initiator port alone.
const RELATIVE_TARGET_PORT: u16 = 1;

/// An I_T nexus: the initiator port (iSCSI name and ISID, RFC 7143 §4.4.1) talking to this
/// target's single port.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Nexus {
    /// InitiatorName from the login.
    pub initiator: String,
    /// ISID of the session.
    pub isid: [u8; 6],
}

/// What a command does to the medium, for the access rules (SPC-4 table 45, SBC-3 table 13).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Access {
    /// Allowed whatever is reserved (INQUIRY, REPORT LUNS, TEST UNIT READY, ...).
    Always,
    /// Reads the medium or the device's state.
    Read,
    /// Changes the medium.
    Write,
    /// RESERVE(6)/RELEASE(6).
    Spc2,
    /// PERSISTENT RESERVE IN/OUT.
    Persistent,
}

fn access_of(cmd: &ScsiCommand) -> Access {
    use ScsiCommand as C;
    match cmd {
        C::TestUnitReady
        | C::RequestSense { .. }
        | C::Inquiry { .. }
        | C::ReportLuns { .. }
        | C::ReadCapacity10
        | C::ReadCapacity16 { .. }
        | C::ReportSupportedOpcodes { .. } => Access::Always,
        C::ModeSense { .. }
        | C::GetLbaStatus { .. }
        | C::Read(_)
        | C::Verify { .. }
        | C::PreFetch { .. } => Access::Read,
        C::Write(_)
        | C::WriteSame { .. }
        | C::Unmap { .. }
        | C::CompareAndWrite { .. }
        | C::SynchronizeCache { .. }
        | C::WriteAndVerify { .. }
        | C::OrWrite(_) => Access::Write,
        C::Reserve6 | C::Release6 => Access::Spc2,
        C::PersistentReserveIn { .. } | C::PersistentReserveOut { .. } => Access::Persistent,
    }
}

#[derive(Debug, Clone)]
struct Persistent {
    /// The nexus that reserved (for the all-registrants types every registrant holds it).
    holder: Nexus,
    kind: u8,
}

#[derive(Debug, Default)]
struct State {
    /// PRgeneration: counts REGISTER, CLEAR and PREEMPT (SPC-4 §6.13.2).
    generation: u32,
    /// Registrations in the order they were made.
    registrations: Vec<(Nexus, u64)>,
    persistent: Option<Persistent>,
    spc2: Option<Nexus>,
}

impl State {
    fn key_of(&self, nexus: &Nexus) -> Option<u64> {
        self.registrations
            .iter()
            .find(|(n, _)| n == nexus)
            .map(|(_, k)| *k)
    }

    fn all_registrants(kind: u8) -> bool {
        matches!(
            kind,
            pr_type::WRITE_EXCLUSIVE_AR | pr_type::EXCLUSIVE_ACCESS_AR
        )
    }

    /// Whether `nexus` holds the persistent reservation (SPC-4 §5.13.10: for the all-registrants
    /// types, every registrant does).
    fn holds(&self, r: &Persistent, nexus: &Nexus) -> bool {
        if Self::all_registrants(r.kind) {
            self.key_of(nexus).is_some()
        } else {
            &r.holder == nexus
        }
    }

    /// The access rules of SPC-4 table 45 for a persistent reservation.
    fn persistent_allows(&self, r: &Persistent, nexus: &Nexus, access: Access) -> bool {
        if self.holds(r, nexus) {
            return true;
        }
        let registered = self.key_of(nexus).is_some();
        let exclusive_access = matches!(
            r.kind,
            pr_type::EXCLUSIVE_ACCESS | pr_type::EXCLUSIVE_ACCESS_RO | pr_type::EXCLUSIVE_ACCESS_AR
        );
        let registrants_only = matches!(
            r.kind,
            pr_type::WRITE_EXCLUSIVE_RO | pr_type::EXCLUSIVE_ACCESS_RO
        );
        match access {
            Access::Always | Access::Persistent => true,
            // Registrants of a registrants-only reservation have the holder's access.
            _ if registrants_only && registered => true,
            Access::Read => !exclusive_access,
            Access::Write | Access::Spc2 => false,
        }
    }

    /// Removes a registration; the reservation goes with it when it was the holder's (or, for
    /// the all-registrants types, the last registrant's) (SPC-4 §5.13.11.2.3).
    fn unregister(&mut self, nexus: &Nexus) {
        self.registrations.retain(|(n, _)| n != nexus);
        if let Some(r) = &self.persistent {
            let gone = if Self::all_registrants(r.kind) {
                self.registrations.is_empty()
            } else {
                &r.holder == nexus
            };
            if gone {
                self.persistent = None;
            }
        }
    }
}

/// The reservation state of one logical unit.
#[derive(Debug, Default)]
pub struct Reservations {
    state: Mutex<State>,
}

fn conflict() -> Failure {
    Failure::ReservationConflict
}

impl Reservations {
    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        // The state is a few plain fields updated in one step each; a panic elsewhere cannot
        // leave it half-written, so a poisoned lock is still usable.
        self.state
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// RESERVATION CONFLICT when a reservation held through another nexus forbids `cmd`.
    pub fn check(&self, nexus: &Nexus, cmd: &ScsiCommand) -> Result<(), Failure> {
        let access = access_of(cmd);
        let s = self.lock();
        if let Some(owner) = &s.spc2 {
            // SPC-2 §5.5.1: another initiator's commands conflict, TEST UNIT READY and READ
            // CAPACITY included (as tgtd does), except those that only identify the device;
            // RELEASE(6) from another initiator is a no-op with GOOD (SPC-2 §7.17).
            let identifies = matches!(
                cmd,
                ScsiCommand::Inquiry { .. }
                    | ScsiCommand::ReportLuns { .. }
                    | ScsiCommand::RequestSense { .. }
                    | ScsiCommand::ReportSupportedOpcodes { .. }
                    | ScsiCommand::Release6
            );
            if owner != nexus && !identifies {
                return Err(conflict());
            }
        }
        if access == Access::Spc2 && !s.registrations.is_empty() {
            // SPC-4 §5.13.3 (SPC-3 §5.6.3): once anyone is registered, RESERVE(6) and
            // RELEASE(6) conflict for everyone.
            return Err(conflict());
        }
        if let Some(r) = &s.persistent {
            if !s.persistent_allows(r, nexus, access) {
                return Err(conflict());
            }
        }
        Ok(())
    }

    /// RESERVE(6).
    pub fn reserve6(&self, nexus: &Nexus) -> Result<(), Failure> {
        let mut s = self.lock();
        match &s.spc2 {
            Some(owner) if owner != nexus => Err(conflict()),
            _ => {
                s.spc2 = Some(nexus.clone());
                Ok(())
            }
        }
    }

    /// RELEASE(6): releases the nexus's own reservation; from another nexus it does nothing.
    pub fn release6(&self, nexus: &Nexus) {
        let mut s = self.lock();
        if s.spc2.as_ref() == Some(nexus) {
            s.spc2 = None;
        }
    }

    /// The nexus is gone (logout or connection loss): its SPC-2 reservation ends (SPC-2 §5.5.1);
    /// its persistent registration and reservation stay (SPC-4 §5.13.1).
    pub fn nexus_lost(&self, nexus: &Nexus) {
        self.release6(nexus);
    }

    /// LOGICAL UNIT RESET or a target reset: SPC-2 reservations end, persistent ones stay.
    pub fn reset(&self) {
        self.lock().spc2 = None;
    }

    /// PERSISTENT RESERVE IN.
    pub fn persistent_in(&self, service_action: u8) -> Result<Vec<u8>, Failure> {
        let s = self.lock();
        Ok(match service_action {
            pr_in::READ_KEYS => {
                let keys: Vec<u64> = s.registrations.iter().map(|(_, k)| *k).collect();
                reservation::read_keys(s.generation, &keys)
            }
            pr_in::READ_RESERVATION => {
                let held = s.persistent.as_ref().map(|r| {
                    // The all-registrants types report key 0 (SPC-4 §6.13.3.3).
                    let key = if State::all_registrants(r.kind) {
                        0
                    } else {
                        s.key_of(&r.holder).unwrap_or(0)
                    };
                    (key, r.kind)
                });
                reservation::read_reservation(s.generation, held)
            }
            pr_in::REPORT_CAPABILITIES => reservation::report_capabilities().to_vec(),
            pr_in::READ_FULL_STATUS => {
                let entries: Vec<FullStatusEntry> = s
                    .registrations
                    .iter()
                    .map(|(n, key)| {
                        let holder = s.persistent.as_ref().is_some_and(|r| s.holds(r, n));
                        FullStatusEntry {
                            key: *key,
                            holder,
                            kind: s.persistent.as_ref().map_or(0, |r| r.kind),
                            relative_target_port: RELATIVE_TARGET_PORT,
                            transport_id: reservation::iscsi_transport_id(&n.initiator, &n.isid),
                        }
                    })
                    .collect();
                reservation::read_full_status(s.generation, &entries)
            }
            _ => return Err(Sense::invalid_field_in_cdb(1, Some(4)).into()),
        })
    }

    /// PERSISTENT RESERVE OUT with its (already length-checked) parameter list.
    pub fn persistent_out(
        &self,
        nexus: &Nexus,
        service_action: u8,
        scope: u8,
        kind: u8,
        data: &[u8],
    ) -> Result<(), Failure> {
        let p = PrOutParameters::parse(data)?;
        if p.specify_initiator_ports {
            return Err(Sense::invalid_field_in_parameter_list(20).into());
        }
        // REPORT CAPABILITIES offers neither ALL_TG_PT nor APTPL.
        if p.all_target_ports || p.persist_through_power_loss {
            return Err(Sense::invalid_field_in_parameter_list(20).into());
        }
        let typed = matches!(
            service_action,
            pr_out::RESERVE | pr_out::RELEASE | pr_out::PREEMPT | pr_out::PREEMPT_AND_ABORT
        );
        if typed {
            if scope != 0 {
                return Err(Sense::invalid_field_in_cdb(2, Some(7)).into());
            }
            if !pr_type::is_valid(kind) {
                return Err(Sense::invalid_field_in_cdb(2, Some(3)).into());
            }
        }
        let mut s = self.lock();
        let current = s.key_of(nexus);
        match service_action {
            pr_out::REGISTER | pr_out::REGISTER_AND_IGNORE => {
                // REGISTER checks the key the nexus holds (0 when unregistered) (SPC-4 §5.13.7).
                if service_action == pr_out::REGISTER && p.key != current.unwrap_or(0) {
                    return Err(conflict());
                }
                match (current, p.service_action_key) {
                    (None, 0) => return Ok(()),
                    (None, key) => s.registrations.push((nexus.clone(), key)),
                    (Some(_), 0) => s.unregister(nexus),
                    (Some(_), key) => {
                        for (n, k) in &mut s.registrations {
                            if n == nexus {
                                *k = key;
                            }
                        }
                    }
                }
                s.generation = s.generation.wrapping_add(1);
                Ok(())
            }
            _ if current != Some(p.key) => Err(conflict()),
            pr_out::RESERVE => match &s.persistent {
                Some(r) if s.holds(r, nexus) && r.kind == kind => Ok(()),
                Some(_) => Err(conflict()),
                None => {
                    s.persistent = Some(Persistent {
                        holder: nexus.clone(),
                        kind,
                    });
                    Ok(())
                }
            },
            pr_out::RELEASE => match &s.persistent {
                Some(r) if s.holds(r, nexus) => {
                    if r.kind != kind {
                        return Err(Sense::illegal_request(
                            asc::INVALID_RELEASE_OF_PERSISTENT_RESERVATION,
                        )
                        .into());
                    }
                    s.persistent = None;
                    Ok(())
                }
                // No reservation, or one this nexus does not hold: GOOD, nothing changes.
                _ => Ok(()),
            },
            pr_out::CLEAR => {
                s.registrations.clear();
                s.persistent = None;
                s.generation = s.generation.wrapping_add(1);
                Ok(())
            }
            pr_out::PREEMPT | pr_out::PREEMPT_AND_ABORT => {
                preempt(&mut s, nexus, p.service_action_key, kind)
            }
            // REGISTER AND MOVE needs a TransportID list and a second target port to move to.
            _ => Err(Sense::invalid_field_in_cdb(1, Some(4)).into()),
        }
    }
}

/// PREEMPT (SPC-4 §5.13.11.4): removes the registrations with the service action key and, when
/// they held the reservation, takes it over with `kind`.
fn preempt(s: &mut State, nexus: &Nexus, victim: u64, kind: u8) -> Result<(), Failure> {
    let reservation = s.persistent.clone();
    match reservation {
        Some(r) if State::all_registrants(r.kind) && victim == 0 => {
            // Key 0 against an all-registrants reservation: everyone else goes, and the
            // preempting nexus holds a new reservation.
            s.registrations.retain(|(n, _)| n == nexus);
            s.persistent = Some(Persistent {
                holder: nexus.clone(),
                kind,
            });
        }
        Some(r) if !State::all_registrants(r.kind) && s.key_of(&r.holder) == Some(victim) => {
            s.registrations.retain(|(n, k)| *k != victim || n == nexus);
            s.persistent = Some(Persistent {
                holder: nexus.clone(),
                kind,
            });
        }
        _ => {
            if victim == 0 {
                return Err(Sense::invalid_field_in_parameter_list(8).into());
            }
            // The preempting nexus keeps its own registration even when it shares the key.
            let before = s.registrations.len();
            s.registrations.retain(|(n, k)| *k != victim || n == nexus);
            if s.registrations.len() == before {
                return Err(conflict());
            }
            if let Some(r) = &s.persistent {
                if State::all_registrants(r.kind) && s.registrations.is_empty() {
                    s.persistent = None;
                }
            }
        }
    }
    s.generation = s.generation.wrapping_add(1);
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use vmdeploy_shared::iscsi::scsi::reservation::parse_read_keys;
    use vmdeploy_shared::iscsi::scsi::BlockRange;

    fn nexus(name: &str) -> Nexus {
        Nexus {
            initiator: name.into(),
            isid: [0x80, 0, 0, 0, 0, 1],
        }
    }

    fn params(key: u64, sark: u64) -> [u8; 24] {
        PrOutParameters {
            key,
            service_action_key: sark,
            specify_initiator_ports: false,
            all_target_ports: false,
            persist_through_power_loss: false,
        }
        .encode()
    }

    const READ: ScsiCommand = ScsiCommand::Read(BlockRange {
        lba: 1,
        blocks: 1,
        fua: false,
    });
    const WRITE: ScsiCommand = ScsiCommand::Write(BlockRange {
        lba: 1,
        blocks: 1,
        fua: false,
    });

    fn keys(r: &Reservations) -> (u32, Vec<u64>) {
        parse_read_keys(&r.persistent_in(pr_in::READ_KEYS).expect("read keys")).expect("parse")
    }

    #[test]
    fn spc2_reservation_blocks_others_until_release_or_nexus_loss() {
        let r = Reservations::default();
        let (a, b) = (nexus("a"), nexus("b"));
        r.reserve6(&a).expect("reserve");
        r.reserve6(&a).expect("the owner may reserve again");
        assert_eq!(r.reserve6(&b), Err(Failure::ReservationConflict));
        assert_eq!(r.check(&b, &READ), Err(Failure::ReservationConflict));
        assert_eq!(
            r.check(&b, &ScsiCommand::TestUnitReady),
            Err(Failure::ReservationConflict)
        );
        let inquiry = ScsiCommand::Inquiry {
            evpd: false,
            page_code: 0,
            allocation_length: 96,
        };
        assert_eq!(r.check(&b, &inquiry), Ok(()));
        assert_eq!(r.check(&b, &ScsiCommand::Release6), Ok(()));
        r.release6(&b);
        assert_eq!(r.check(&b, &WRITE), Err(Failure::ReservationConflict));
        assert_eq!(r.check(&a, &WRITE), Ok(()));
        r.nexus_lost(&a);
        r.reserve6(&b).expect("free after nexus loss");
        r.reset();
        r.reserve6(&a).expect("free after a reset");
    }

    #[test]
    fn register_reserve_and_access_by_type() {
        let (a, b, c) = (nexus("a"), nexus("b"), nexus("c"));
        for (kind, reg_read, reg_write, unreg_read, unreg_write) in [
            (pr_type::EXCLUSIVE_ACCESS, false, false, false, false),
            (pr_type::WRITE_EXCLUSIVE, true, false, true, false),
            (pr_type::EXCLUSIVE_ACCESS_RO, true, true, false, false),
            (pr_type::WRITE_EXCLUSIVE_RO, true, true, true, false),
            (pr_type::EXCLUSIVE_ACCESS_AR, true, true, false, false),
            (pr_type::WRITE_EXCLUSIVE_AR, true, true, true, false),
        ] {
            let r = Reservations::default();
            r.persistent_out(&a, pr_out::REGISTER_AND_IGNORE, 0, 0, &params(0, 1))
                .expect("register a");
            r.persistent_out(&b, pr_out::REGISTER, 0, 0, &params(0, 2))
                .expect("register b");
            r.persistent_out(&a, pr_out::RESERVE, 0, kind, &params(1, 0))
                .expect("reserve");
            let ok = |n: &Nexus, cmd: &ScsiCommand| r.check(n, cmd).is_ok();
            assert!(ok(&a, &READ) && ok(&a, &WRITE), "holder, type {kind}");
            assert_eq!(ok(&b, &READ), reg_read, "registered read, type {kind}");
            assert_eq!(ok(&b, &WRITE), reg_write, "registered write, type {kind}");
            assert_eq!(ok(&c, &READ), unreg_read, "unregistered read, type {kind}");
            assert_eq!(
                ok(&c, &WRITE),
                unreg_write,
                "unregistered write, type {kind}"
            );
            let wrong = if kind == pr_type::WRITE_EXCLUSIVE {
                3
            } else {
                1
            };
            let err = r
                .persistent_out(&a, pr_out::RELEASE, 0, wrong, &params(1, 0))
                .expect_err("release with another type");
            assert_eq!(
                err.sense().map(|s| (s.asc, s.ascq)),
                Some(asc::INVALID_RELEASE_OF_PERSISTENT_RESERVATION)
            );
            r.persistent_out(&a, pr_out::RELEASE, 0, kind, &params(1, 0))
                .expect("release");
            assert!(ok(&c, &WRITE));
        }
    }

    #[test]
    fn wrong_key_conflicts_and_generation_counts() {
        let r = Reservations::default();
        let (a, b) = (nexus("a"), nexus("b"));
        r.persistent_out(&a, pr_out::REGISTER, 0, 0, &params(0, 7))
            .expect("register");
        assert_eq!(
            r.persistent_out(&a, pr_out::REGISTER, 0, 0, &params(8, 9)),
            Err(Failure::ReservationConflict)
        );
        assert_eq!(
            r.persistent_out(&b, pr_out::RESERVE, 0, 1, &params(7, 0)),
            Err(Failure::ReservationConflict),
            "an unregistered nexus cannot use another's key"
        );
        r.persistent_out(&b, pr_out::REGISTER, 0, 0, &params(0, 8))
            .expect("register b");
        assert_eq!(keys(&r), (2, vec![7, 8]));
        r.persistent_out(&b, pr_out::PREEMPT, 0, 3, &params(8, 7))
            .expect("preempt a");
        assert_eq!(keys(&r), (3, vec![8]));
        r.persistent_out(&b, pr_out::CLEAR, 0, 0, &params(8, 0))
            .expect("clear");
        assert_eq!(keys(&r), (4, vec![]));
    }

    #[test]
    fn registrations_survive_nexus_loss_and_block_reserve6() {
        let r = Reservations::default();
        let a = nexus("a");
        r.persistent_out(&a, pr_out::REGISTER, 0, 0, &params(0, 5))
            .expect("register");
        r.persistent_out(&a, pr_out::RESERVE, 0, 1, &params(5, 0))
            .expect("reserve");
        r.nexus_lost(&a);
        r.reset();
        assert_eq!(keys(&r).1, vec![5]);
        let res = r.persistent_in(pr_in::READ_RESERVATION).expect("read");
        assert_eq!(res[21], 1, "the reservation is still there");
        assert_eq!(
            r.check(&nexus("b"), &ScsiCommand::Reserve6),
            Err(Failure::ReservationConflict)
        );
    }

    #[test]
    fn bad_parameter_lists_are_refused() {
        let r = Reservations::default();
        let a = nexus("a");
        let sense = |f: Failure| f.sense().map(|s| (s.asc, s.ascq));
        let short = r
            .persistent_out(&a, pr_out::REGISTER, 0, 0, &[0; 20])
            .expect_err("short list");
        assert_eq!(sense(short), Some(asc::PARAMETER_LIST_LENGTH_ERROR));
        let mut aptpl = params(0, 1);
        aptpl[20] = 0x01;
        let e = r
            .persistent_out(&a, pr_out::REGISTER, 0, 0, &aptpl)
            .expect_err("APTPL");
        assert_eq!(sense(e), Some(asc::INVALID_FIELD_IN_PARAMETER_LIST));
        r.persistent_out(&a, pr_out::REGISTER, 0, 0, &params(0, 1))
            .expect("register");
        let e = r
            .persistent_out(&a, pr_out::RESERVE, 0, 2, &params(1, 0))
            .expect_err("type 2 is reserved");
        assert_eq!(sense(e), Some(asc::INVALID_FIELD_IN_CDB));
        let e = r
            .persistent_out(&a, pr_out::RESERVE, 1, 1, &params(1, 0))
            .expect_err("scope 1");
        assert_eq!(sense(e), Some(asc::INVALID_FIELD_IN_CDB));
    }

    proptest::proptest! {
        #[test]
        fn any_sequence_keeps_state_consistent(
            ops in proptest::collection::vec((0u8..3, 0u8..9, 0u8..10, 0u64..4, 0u64..4), 0..40)
        ) {
            let r = Reservations::default();
            let names = [nexus("a"), nexus("b"), nexus("c")];
            for (who, sa, kind, key, sark) in ops {
                let n = &names[usize::from(who)];
                let _ = r.persistent_out(n, sa, 0, kind, &params(key, sark));
                let s = r.lock();
                // At most one registration per nexus, and a reservation only with registrants.
                for (i, (x, _)) in s.registrations.iter().enumerate() {
                    proptest::prop_assert!(s.registrations[i + 1..].iter().all(|(y, _)| y != x));
                }
                if s.persistent.is_some() {
                    proptest::prop_assert!(!s.registrations.is_empty());
                }
            }
        }
    }
}
