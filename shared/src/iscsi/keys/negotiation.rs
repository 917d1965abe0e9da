//! The operational key negotiation (RFC 7143 §13, §6.2): the parameters of a session and how
//! each key's value is agreed, for either end of the connection.

use super::{bool_value, key, parse_bool, parse_number, truncate, value, KeysError, TextKeys};

/// The operational parameters of a session (RFC 7143 §13). As `local` in a [`Negotiation`] they
/// are this side's wishes and limits; as `result` they are the values in force.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct OperationalParams {
    /// Largest data segment this side receives (declared to the peer).
    pub max_recv_data_segment_length: u32,
    /// Largest data segment this side may send: the peer's MaxRecvDataSegmentLength (in
    /// `result` only).
    pub max_xmit_data_segment_length: u32,
    /// MaxBurstLength.
    pub max_burst_length: u32,
    /// FirstBurstLength: unsolicited data per command.
    pub first_burst_length: u32,
    /// InitialR2T: whether unsolicited Data-Out PDUs are forbidden.
    pub initial_r2t: bool,
    /// ImmediateData: whether data may ride in the SCSI Command PDU.
    pub immediate_data: bool,
    /// MaxOutstandingR2T per task.
    pub max_outstanding_r2t: u32,
    /// CRC32C header digests (locally: offered or accepted).
    pub header_digest: bool,
    /// CRC32C data digests (locally: offered or accepted).
    pub data_digest: bool,
    /// ErrorRecoveryLevel.
    pub error_recovery_level: u32,
    /// DataPDUInOrder.
    pub data_pdu_in_order: bool,
    /// DataSequenceInOrder.
    pub data_sequence_in_order: bool,
    /// DefaultTime2Wait (seconds).
    pub default_time2wait: u32,
    /// DefaultTime2Retain (seconds).
    pub default_time2retain: u32,
    /// MaxConnections.
    pub max_connections: u32,
}

impl Default for OperationalParams {
    /// The RFC 7143 §13 defaults, in force until negotiated otherwise.
    fn default() -> Self {
        OperationalParams {
            max_recv_data_segment_length: 8192,
            max_xmit_data_segment_length: 8192,
            max_burst_length: 262_144,
            first_burst_length: 65_536,
            initial_r2t: true,
            immediate_data: true,
            max_outstanding_r2t: 1,
            header_digest: false,
            data_digest: false,
            error_recovery_level: 0,
            data_pdu_in_order: true,
            data_sequence_in_order: true,
            default_time2wait: 2,
            default_time2retain: 20,
            max_connections: 1,
        }
    }
}

impl OperationalParams {
    /// The digests these parameters select.
    pub fn digests(&self) -> crate::iscsi::Digests {
        crate::iscsi::Digests {
            header: self.header_digest,
            data: self.data_digest,
        }
    }
}

/// Which end of the connection this side is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Role {
    /// The initiator (proposes everything it cares about).
    Initiator,
    /// The target (answers, and declares its MaxRecvDataSegmentLength).
    Target,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Rule {
    Declarative,
    Min { lo: u64, hi: u64 },
    Max { lo: u64, hi: u64 },
    Or,
    And,
    DigestList,
    Marker,
    MarkInt,
}

fn rule_of(k: &str) -> Option<Rule> {
    Some(match k {
        key::MAX_RECV_DATA_SEGMENT_LENGTH => Rule::Declarative,
        key::MAX_BURST_LENGTH | key::FIRST_BURST_LENGTH => Rule::Min {
            lo: 512,
            hi: (1 << 24) - 1,
        },
        key::MAX_OUTSTANDING_R2T | key::MAX_CONNECTIONS => Rule::Min { lo: 1, hi: 65535 },
        key::ERROR_RECOVERY_LEVEL => Rule::Min { lo: 0, hi: 2 },
        key::DEFAULT_TIME2RETAIN => Rule::Min { lo: 0, hi: 3600 },
        key::DEFAULT_TIME2WAIT => Rule::Max { lo: 0, hi: 3600 },
        key::INITIAL_R2T | key::DATA_PDU_IN_ORDER | key::DATA_SEQUENCE_IN_ORDER => Rule::Or,
        key::IMMEDIATE_DATA => Rule::And,
        key::HEADER_DIGEST | key::DATA_DIGEST => Rule::DigestList,
        key::IF_MARKER | key::OF_MARKER => Rule::Marker,
        key::IF_MARK_INT | key::OF_MARK_INT => Rule::MarkInt,
        _ => return None,
    })
}

/// Keys the caller handles itself (names, authentication, discovery); `receive` skips them.
pub fn is_login_or_discovery_key(k: &str) -> bool {
    matches!(
        k,
        key::SEND_TARGETS
            | key::TARGET_NAME
            | key::INITIATOR_NAME
            | key::TARGET_ALIAS
            | key::INITIATOR_ALIAS
            | key::TARGET_ADDRESS
            | key::TARGET_PORTAL_GROUP_TAG
            | key::SESSION_TYPE
            | key::AUTH_METHOD
            | key::CHAP_A
            | key::CHAP_I
            | key::CHAP_C
            | key::CHAP_N
            | key::CHAP_R
    )
}

/// Operational key negotiation for one side of a connection.
#[derive(Clone, Debug)]
pub struct Negotiation {
    role: Role,
    /// This side's wishes and limits.
    pub local: OperationalParams,
    /// The values in force.
    pub result: OperationalParams,
    offered: Vec<(&'static str, String)>,
    declared: bool,
}

impl Negotiation {
    /// Starts a negotiation with RFC defaults in force.
    pub fn new(role: Role, local: OperationalParams) -> Negotiation {
        Negotiation {
            role,
            local,
            result: OperationalParams::default(),
            offered: Vec::new(),
            declared: false,
        }
    }

    fn get_num(p: &OperationalParams, k: &str) -> u64 {
        u64::from(match k {
            key::MAX_BURST_LENGTH => p.max_burst_length,
            key::FIRST_BURST_LENGTH => p.first_burst_length,
            key::MAX_OUTSTANDING_R2T => p.max_outstanding_r2t,
            key::MAX_CONNECTIONS => p.max_connections,
            key::ERROR_RECOVERY_LEVEL => p.error_recovery_level,
            key::DEFAULT_TIME2RETAIN => p.default_time2retain,
            key::DEFAULT_TIME2WAIT => p.default_time2wait,
            _ => 0,
        })
    }

    fn set_num(p: &mut OperationalParams, k: &str, v: u64) {
        let v = u32::try_from(v).unwrap_or(u32::MAX);
        match k {
            key::MAX_BURST_LENGTH => p.max_burst_length = v,
            key::FIRST_BURST_LENGTH => p.first_burst_length = v,
            key::MAX_OUTSTANDING_R2T => p.max_outstanding_r2t = v,
            key::MAX_CONNECTIONS => p.max_connections = v,
            key::ERROR_RECOVERY_LEVEL => p.error_recovery_level = v,
            key::DEFAULT_TIME2RETAIN => p.default_time2retain = v,
            key::DEFAULT_TIME2WAIT => p.default_time2wait = v,
            _ => {}
        }
    }

    fn get_bool(p: &OperationalParams, k: &str) -> bool {
        match k {
            key::INITIAL_R2T => p.initial_r2t,
            key::IMMEDIATE_DATA => p.immediate_data,
            key::DATA_PDU_IN_ORDER => p.data_pdu_in_order,
            key::DATA_SEQUENCE_IN_ORDER => p.data_sequence_in_order,
            key::HEADER_DIGEST => p.header_digest,
            key::DATA_DIGEST => p.data_digest,
            _ => false,
        }
    }

    fn set_bool(p: &mut OperationalParams, k: &str, v: bool) {
        match k {
            key::INITIAL_R2T => p.initial_r2t = v,
            key::IMMEDIATE_DATA => p.immediate_data = v,
            key::DATA_PDU_IN_ORDER => p.data_pdu_in_order = v,
            key::DATA_SEQUENCE_IN_ORDER => p.data_sequence_in_order = v,
            key::HEADER_DIGEST => p.header_digest = v,
            key::DATA_DIGEST => p.data_digest = v,
            _ => {}
        }
    }

    fn digest_offer(wanted: bool) -> String {
        // Prefer CRC32C when wanted but accept None, so a peer without digests still logs in.
        if wanted {
            format!("{},{}", value::CRC32C, value::NONE)
        } else {
            value::NONE.to_string()
        }
    }

    /// The keys this side proposes that it has not proposed yet. The initiator proposes every
    /// operational key; the target only declares its MaxRecvDataSegmentLength.
    pub fn offer(&mut self) -> TextKeys {
        let mut keys = TextKeys::new();
        if !self.declared {
            self.declared = true;
            self.result.max_recv_data_segment_length = self.local.max_recv_data_segment_length;
            keys.push(
                key::MAX_RECV_DATA_SEGMENT_LENGTH,
                self.local.max_recv_data_segment_length.to_string(),
            );
        }
        if self.role == Role::Target || !self.offered.is_empty() {
            return keys;
        }
        let l = &self.local;
        let proposals: Vec<(&'static str, String)> = vec![
            (key::HEADER_DIGEST, Self::digest_offer(l.header_digest)),
            (key::DATA_DIGEST, Self::digest_offer(l.data_digest)),
            (key::INITIAL_R2T, bool_value(l.initial_r2t).to_string()),
            (
                key::IMMEDIATE_DATA,
                bool_value(l.immediate_data).to_string(),
            ),
            (key::MAX_BURST_LENGTH, l.max_burst_length.to_string()),
            (key::FIRST_BURST_LENGTH, l.first_burst_length.to_string()),
            (key::MAX_OUTSTANDING_R2T, l.max_outstanding_r2t.to_string()),
            (key::MAX_CONNECTIONS, l.max_connections.to_string()),
            (
                key::ERROR_RECOVERY_LEVEL,
                l.error_recovery_level.to_string(),
            ),
            (key::DEFAULT_TIME2WAIT, l.default_time2wait.to_string()),
            (key::DEFAULT_TIME2RETAIN, l.default_time2retain.to_string()),
            (
                key::DATA_PDU_IN_ORDER,
                bool_value(l.data_pdu_in_order).to_string(),
            ),
            (
                key::DATA_SEQUENCE_IN_ORDER,
                bool_value(l.data_sequence_in_order).to_string(),
            ),
        ];
        for (k, v) in proposals {
            keys.push(k, v.clone());
            self.offered.push((k, v));
        }
        keys
    }

    /// Whether every key this side offered has been answered.
    pub fn complete(&self) -> bool {
        self.offered.is_empty() || self.offered.iter().all(|(k, _)| k.is_empty())
    }

    /// Processes the peer's keys: answers to this side's offers are checked and adopted, offers
    /// from the peer are resolved and answered. Returns the answers to send (possibly empty).
    pub fn receive(&mut self, peer: &TextKeys) -> Result<TextKeys, KeysError> {
        let mut answers = TextKeys::new();
        for (k, v) in peer.iter() {
            if is_login_or_discovery_key(k) {
                continue;
            }
            let pending = self.offered.iter().position(|(o, _)| *o == k);
            match rule_of(k) {
                None => {
                    if v != value::NOT_UNDERSTOOD {
                        answers.push(k, value::NOT_UNDERSTOOD);
                    }
                }
                Some(Rule::Declarative) => {
                    let n = parse_number(k, v)?;
                    if !(512..=(1 << 24) - 1).contains(&n) {
                        return Err(KeysError::InvalidValue {
                            key: k.to_string(),
                            value: v.to_string(),
                        });
                    }
                    self.result.max_xmit_data_segment_length = n as u32;
                    if self.role == Role::Target && !self.declared {
                        answers.extend(self.offer());
                    }
                }
                Some(rule) => match pending {
                    Some(i) => {
                        let (_, offered) = self.offered[i].clone();
                        // Mark answered without shifting indexes of other pending keys.
                        self.offered[i].0 = "";
                        self.adopt_answer(k, rule, &offered, v)?;
                    }
                    None => {
                        if let Some(answer) = self.answer_offer(k, rule, v) {
                            answers.push(k, answer);
                        }
                    }
                },
            }
        }
        Ok(answers)
    }

    /// Checks and adopts the peer's answer `v` to this side's offer `offered` of key `k`.
    fn adopt_answer(
        &mut self,
        k: &str,
        rule: Rule,
        offered: &str,
        v: &str,
    ) -> Result<(), KeysError> {
        if v == value::IRRELEVANT || v == value::NOT_UNDERSTOOD || v == value::REJECT {
            // The default stays in force (RFC 7143 §6.2, §6.4).
            return Ok(());
        }
        let bad = || KeysError::InvalidAnswer {
            key: k.to_string(),
            value: truncate(v),
            offered: offered.to_string(),
        };
        match rule {
            Rule::Min { lo, hi } | Rule::Max { lo, hi } => {
                let n = parse_number(k, v)?;
                let mine = parse_number(k, offered)?;
                let allowed = match rule {
                    Rule::Min { .. } => n <= mine,
                    _ => n >= mine,
                };
                if !allowed || n < lo || n > hi {
                    return Err(bad());
                }
                Self::set_num(&mut self.result, k, n);
            }
            Rule::Or | Rule::And => {
                let b = parse_bool(k, v)?;
                let mine = parse_bool(k, offered)?;
                // OR: an offer of Yes must be answered Yes; AND: No must be answered No.
                if (rule == Rule::Or && mine && !b) || (rule == Rule::And && !mine && b) {
                    return Err(bad());
                }
                Self::set_bool(&mut self.result, k, b);
            }
            Rule::DigestList => {
                if !offered.split(',').any(|o| o == v) {
                    return Err(bad());
                }
                Self::set_bool(&mut self.result, k, v == value::CRC32C);
            }
            Rule::Declarative | Rule::Marker | Rule::MarkInt => {}
        }
        Ok(())
    }

    /// Resolves the peer's offer `v` of key `k` with this side's wish and returns the answer.
    fn answer_offer(&mut self, k: &str, rule: Rule, v: &str) -> Option<String> {
        match rule {
            Rule::Min { lo, hi } | Rule::Max { lo, hi } => {
                let Ok(n) = parse_number(k, v) else {
                    return Some(value::REJECT.to_string());
                };
                if n < lo || n > hi {
                    return Some(value::REJECT.to_string());
                }
                let mine = Self::get_num(&self.local, k);
                let chosen = if matches!(rule, Rule::Min { .. }) {
                    n.min(mine)
                } else {
                    n.max(mine)
                };
                Self::set_num(&mut self.result, k, chosen);
                Some(chosen.to_string())
            }
            Rule::Or | Rule::And => {
                let Ok(b) = parse_bool(k, v) else {
                    return Some(value::REJECT.to_string());
                };
                let mine = Self::get_bool(&self.local, k);
                let chosen = if rule == Rule::Or {
                    b || mine
                } else {
                    b && mine
                };
                Self::set_bool(&mut self.result, k, chosen);
                Some(bool_value(chosen).to_string())
            }
            Rule::DigestList => {
                let mine = Self::get_bool(&self.local, k);
                let choice = v
                    .split(',')
                    .find(|o| *o == value::NONE || (*o == value::CRC32C && mine));
                match choice {
                    Some(c) => {
                        Self::set_bool(&mut self.result, k, c == value::CRC32C);
                        Some(c.to_string())
                    }
                    None => Some(value::REJECT.to_string()),
                }
            }
            Rule::Marker => Some(value::NO.to_string()),
            Rule::MarkInt => Some(value::IRRELEVANT.to_string()),
            Rule::Declarative => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tuned() -> OperationalParams {
        OperationalParams {
            max_recv_data_segment_length: 262_144,
            max_burst_length: 1 << 20,
            first_burst_length: 262_144,
            initial_r2t: false,
            immediate_data: true,
            max_outstanding_r2t: 1,
            ..OperationalParams::default()
        }
    }

    #[test]
    fn initiator_and_target_agree() {
        let mut initiator = Negotiation::new(Role::Initiator, tuned());
        let target_local = OperationalParams {
            max_recv_data_segment_length: 65_536,
            max_burst_length: 262_144,
            first_burst_length: 65_536,
            initial_r2t: true,
            header_digest: true,
            ..OperationalParams::default()
        };
        let mut target = Negotiation::new(Role::Target, target_local);
        let offer = initiator.offer();
        assert!(offer.contains(key::MAX_RECV_DATA_SEGMENT_LENGTH));
        let answer = target.receive(&offer).expect("target answers");
        assert_eq!(answer.get(key::MAX_RECV_DATA_SEGMENT_LENGTH), Some("65536"));
        assert_eq!(answer.get(key::INITIAL_R2T), Some("Yes"));
        assert_eq!(answer.get(key::HEADER_DIGEST), Some("None"));
        let back = initiator.receive(&answer).expect("valid answers");
        assert!(back.is_empty(), "nothing more to say: {back:?}");
        assert!(initiator.complete());
        for side in [&initiator.result, &target.result] {
            assert_eq!(side.max_burst_length, 262_144);
            assert_eq!(side.first_burst_length, 65_536);
            assert!(side.initial_r2t);
            assert!(side.immediate_data);
            assert!(!side.header_digest);
        }
        assert_eq!(initiator.result.max_recv_data_segment_length, 262_144);
        assert_eq!(initiator.result.max_xmit_data_segment_length, 65_536);
        assert_eq!(target.result.max_xmit_data_segment_length, 262_144);
        assert_eq!(target.result.max_recv_data_segment_length, 65_536);
    }

    #[test]
    fn digests_negotiate_when_both_want_them() {
        let mut initiator = Negotiation::new(
            Role::Initiator,
            OperationalParams {
                header_digest: true,
                data_digest: true,
                ..tuned()
            },
        );
        let mut target = Negotiation::new(
            Role::Target,
            OperationalParams {
                header_digest: true,
                data_digest: true,
                ..OperationalParams::default()
            },
        );
        let answer = target.receive(&initiator.offer()).expect("answers");
        assert_eq!(answer.get(key::DATA_DIGEST), Some("CRC32C"));
        initiator.receive(&answer).expect("valid");
        assert!(initiator.result.digests().header && initiator.result.digests().data);
        assert_eq!(initiator.result.digests(), target.result.digests());
    }

    #[test]
    fn bad_answers_are_errors_and_unknown_keys_not_understood() {
        let mut initiator = Negotiation::new(Role::Initiator, tuned());
        let _ = initiator.offer();
        let mut answer = TextKeys::new();
        answer.push(key::MAX_BURST_LENGTH, "2000000");
        assert!(matches!(
            initiator.receive(&answer),
            Err(KeysError::InvalidAnswer { .. })
        ));
        let mut answer = TextKeys::new();
        answer.push(key::HEADER_DIGEST, "CRC32C");
        assert!(initiator.receive(&answer).is_err(), "None was offered");
        let mut answer = TextKeys::new();
        answer.push(key::IMMEDIATE_DATA, value::IRRELEVANT);
        answer.push("X-com.example.Key", "1");
        answer.push(key::TARGET_ALIAS, "alias");
        let back = initiator.receive(&answer).expect("tolerated");
        assert_eq!(back.get("X-com.example.Key"), Some(value::NOT_UNDERSTOOD));
        assert_eq!(back.len(), 1);
        let mut target = Negotiation::new(Role::Target, OperationalParams::default());
        let mut offer = TextKeys::new();
        offer.push(key::MAX_BURST_LENGTH, "12");
        offer.push(key::IF_MARKER, "No");
        offer.push(key::OF_MARK_INT, "2048~8192");
        let back = target.receive(&offer).expect("answers");
        assert_eq!(back.get(key::MAX_BURST_LENGTH), Some(value::REJECT));
        assert_eq!(back.get(key::IF_MARKER), Some(value::NO));
        assert_eq!(back.get(key::OF_MARK_INT), Some(value::IRRELEVANT));
    }
}
