//! The login phase (RFC 7143 §6.3): connect, authenticate (CHAP, RFC 7143 §12.1.3), negotiate the
//! operational keys, reach the full feature phase. Also discovery (`SendTargets`, RFC 7143
//! Appendix C) on a discovery session.

use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
use tokio::net::TcpStream;
use tracing::{debug, info};
use vmdeploy_shared::iscsi::chap::{respond_to_challenge, ChapChallenge};
use vmdeploy_shared::iscsi::keys::{
    key, parse_send_targets, value, DiscoveredTarget, Negotiation, Role,
};
use vmdeploy_shared::iscsi::pdu::{logout_reason, logout_response, ISCSI_VERSION};
use vmdeploy_shared::iscsi::{
    Bhs, Digests, LoggedIn, LoginRequest, LoginResponse, LoginStage, LogoutRequest, Pdu,
    PduDecoder, SessionKind, TextKeys, TextRequest, RESERVED_TAG,
};

use super::transport::{send_pdu, shutdown, PduReader};
use super::{InitiatorError, SessionConfig};

/// Largest data segment a target must accept during login (RFC 7143 §13.12: the default
/// MaxRecvDataSegmentLength of 8192 holds until the login ends).
const LOGIN_SEGMENT_LIMIT: usize = 8192;
/// Most login request/response rounds before giving up on a target that never transits.
const MAX_LOGIN_ROUNDS: usize = 16;
/// The Initiator Task Tag of every login PDU (all PDUs of one login share it).
const LOGIN_ITT: u32 = 0;
/// The connection ID (one connection per session).
const CID: u16 = 0;

/// A connection in the full feature phase: its two halves and what the login established.
pub struct Connected {
    /// Receive side.
    pub reader: PduReader<OwnedReadHalf>,
    /// Send side.
    pub writer: OwnedWriteHalf,
    /// The negotiated values and where the sequence numbers start.
    pub session: LoggedIn,
}

fn random_isid() -> [u8; 6] {
    // RFC 7143 §11.12.5: type 10b ("random"): byte 0 = 0x80, then 3 random bytes and a 2-byte
    // qualifier.
    let mut isid = [0u8; 6];
    if getrandom::fill(&mut isid[1..]).is_err() {
        // A fixed ISID only risks session reinstatement against the same target; carry on.
        isid[1..].copy_from_slice(&[0x56, 0x4d, 0x44, 0x00, 0x01]);
    }
    isid[0] = 0x80;
    isid
}

/// Opens the TCP connection to the portal, within the connect timeout.
pub async fn connect(config: &SessionConfig) -> Result<TcpStream, InitiatorError> {
    let portal = config.portal.clone();
    let stream =
        match tokio::time::timeout(config.timeouts.connect, TcpStream::connect(portal.as_str()))
            .await
        {
            Ok(Ok(stream)) => stream,
            Ok(Err(source)) => return Err(InitiatorError::Connect { portal, source }),
            Err(_) => {
                return Err(InitiatorError::Connect {
                    portal,
                    source: std::io::Error::new(
                        std::io::ErrorKind::TimedOut,
                        format!("no answer within {:?}", config.timeouts.connect),
                    ),
                })
            }
        };
    // Small PDUs (R2T answers, status) must not wait for Nagle.
    stream
        .set_nodelay(true)
        .map_err(|source| InitiatorError::Connect {
            portal: config.portal.clone(),
            source,
        })?;
    Ok(stream)
}

struct Login<'a> {
    config: &'a SessionConfig,
    reader: PduReader<OwnedReadHalf>,
    writer: OwnedWriteHalf,
    isid: [u8; 6],
    tsih: u16,
    cmd_sn: u32,
    exp_stat_sn: u32,
    max_cmd_sn: u32,
    target_label: String,
}

impl Login<'_> {
    /// Sends one login request and collects the (possibly continued) response.
    async fn exchange(
        &mut self,
        stage: LoginStage,
        transit: bool,
        next_stage: LoginStage,
        keys: &TextKeys,
    ) -> Result<(LoginResponse, TextKeys), InitiatorError> {
        let text = keys.encode();
        if text.len() > LOGIN_SEGMENT_LIMIT {
            return Err(InitiatorError::Protocol(format!(
                "login text of {} bytes is over the {LOGIN_SEGMENT_LIMIT}-byte limit",
                text.len()
            )));
        }
        let mut data = text;
        let mut collected = Vec::new();
        for _ in 0..MAX_LOGIN_ROUNDS {
            let request = LoginRequest {
                transit,
                continue_: false,
                current_stage: stage,
                next_stage: if transit { next_stage } else { stage },
                version_max: ISCSI_VERSION,
                version_min: ISCSI_VERSION,
                isid: self.isid,
                tsih: self.tsih,
                itt: LOGIN_ITT,
                cid: CID,
                cmd_sn: self.cmd_sn,
                exp_stat_sn: self.exp_stat_sn,
            };
            let pdu = Pdu::with_data(request, std::mem::take(&mut data));
            send_pdu(
                &mut self.writer,
                &pdu,
                Digests::NONE,
                self.config.timeouts.login,
            )
            .await?;
            let reply = self
                .reader
                .next_within(self.config.timeouts.login, "waiting for a login response")
                .await?;
            let response = match reply.bhs {
                Bhs::LoginResponse(h) => h,
                Bhs::Reject(r) => {
                    return Err(InitiatorError::Protocol(format!(
                        "the target rejected the login request (reason {:#04x})",
                        r.reason
                    )))
                }
                other => {
                    return Err(InitiatorError::Protocol(format!(
                        "expected a login response, got {:?}",
                        other.opcode()
                    )))
                }
            };
            if !response.status.is_success() {
                let mut status = response.status.to_string();
                if response.status.class == 1 {
                    if let Ok(keys) = TextKeys::parse(&reply.data) {
                        if let Some(addr) = keys.get(key::TARGET_ADDRESS) {
                            status.push_str(&format!(", TargetAddress={addr}"));
                        }
                    }
                    debug!(%status, "login redirected");
                }
                return Err(InitiatorError::LoginRejected {
                    target: self.target_label.clone(),
                    status: response.status,
                });
            }
            if response.itt != LOGIN_ITT {
                return Err(InitiatorError::Protocol(format!(
                    "login response for task {:#x}, expected {LOGIN_ITT:#x}",
                    response.itt
                )));
            }
            if response.version_active != ISCSI_VERSION {
                return Err(InitiatorError::Protocol(format!(
                    "target chose iSCSI version {:#x}",
                    response.version_active
                )));
            }
            self.exp_stat_sn = response.stat_sn.wrapping_add(1);
            self.max_cmd_sn = response.max_cmd_sn;
            collected.extend_from_slice(&reply.data);
            if response.continue_ {
                // RFC 7143 §6.3: answer a continued response with an empty request.
                continue;
            }
            let keys = TextKeys::parse(&collected)?;
            debug!(?keys, stage = ?response.current_stage, transit = response.transit, "login response");
            if response.transit {
                self.tsih = response.tsih;
            }
            return Ok((response, keys));
        }
        Err(InitiatorError::Protocol(
            "the login response never ended (too many continuations)".into(),
        ))
    }

    async fn security_stage(&mut self, first: TextKeys) -> Result<(), InitiatorError> {
        let Some(creds) = self.config.chap.clone() else {
            let mut keys = first;
            keys.push(key::AUTH_METHOD, value::NONE);
            let (mut response, mut answer) = self
                .exchange(LoginStage::Security, true, LoginStage::Operational, &keys)
                .await?;
            for _ in 0..MAX_LOGIN_ROUNDS {
                if let Some(method) = answer.get(key::AUTH_METHOD) {
                    if method != value::NONE {
                        return Err(InitiatorError::Authentication(format!(
                            "the target wants AuthMethod={method}; give CHAP credentials"
                        )));
                    }
                }
                if response.transit {
                    return Ok(());
                }
                (response, answer) = self
                    .exchange(
                        LoginStage::Security,
                        true,
                        LoginStage::Operational,
                        &TextKeys::new(),
                    )
                    .await?;
            }
            return Err(InitiatorError::Protocol(
                "the target never left the security stage".into(),
            ));
        };

        let mut keys = first;
        keys.push(key::AUTH_METHOD, value::CHAP);
        let (_, answer) = self
            .exchange(LoginStage::Security, false, LoginStage::Security, &keys)
            .await?;
        match answer.get(key::AUTH_METHOD) {
            Some(value::CHAP) => {}
            other => {
                return Err(InitiatorError::Authentication(format!(
                    "the target does not accept CHAP (AuthMethod={})",
                    other.unwrap_or("<none>")
                )))
            }
        }
        let mut keys = TextKeys::new();
        keys.push(
            key::CHAP_A,
            vmdeploy_shared::iscsi::chap::CHAP_ALGORITHM_MD5.to_string(),
        );
        let (_, challenge) = self
            .exchange(LoginStage::Security, false, LoginStage::Security, &keys)
            .await?;
        let mutual = match &self.config.mutual_chap {
            Some(_) => Some(
                ChapChallenge::generate()
                    .map_err(|e| InitiatorError::Authentication(e.to_string()))?,
            ),
            None => None,
        };
        let reply = respond_to_challenge(&challenge, &creds, mutual.as_ref())
            .map_err(|e| InitiatorError::Authentication(e.to_string()))?;
        let (mut response, answer) = self
            .exchange(LoginStage::Security, true, LoginStage::Operational, &reply)
            .await?;
        if let (Some(ours), Some(expected)) = (&mutual, &self.config.mutual_chap) {
            ours.check(&answer, expected).map_err(|e| {
                InitiatorError::Authentication(format!("the target failed mutual CHAP: {e}"))
            })?;
        }
        for _ in 0..MAX_LOGIN_ROUNDS {
            if response.transit {
                return Ok(());
            }
            (response, _) = self
                .exchange(
                    LoginStage::Security,
                    true,
                    LoginStage::Operational,
                    &TextKeys::new(),
                )
                .await?;
        }
        Err(InitiatorError::Protocol(
            "the target never left the security stage".into(),
        ))
    }

    async fn operational_stage(
        &mut self,
        negotiation: &mut Negotiation,
    ) -> Result<(), InitiatorError> {
        let mut keys = negotiation.offer();
        for _ in 0..MAX_LOGIN_ROUNDS {
            let (response, answer) = self
                .exchange(
                    LoginStage::Operational,
                    true,
                    LoginStage::FullFeature,
                    &keys,
                )
                .await?;
            keys = negotiation.receive(&answer)?;
            if response.transit && response.next_stage == LoginStage::FullFeature {
                return Ok(());
            }
        }
        Err(InitiatorError::Protocol(
            "the target never agreed to the full feature phase".into(),
        ))
    }
}

/// Logs in: security stage (with CHAP when configured), operational negotiation, full feature
/// phase. Every wait is bounded by `config.timeouts`.
pub async fn login(config: &SessionConfig, kind: SessionKind) -> Result<Connected, InitiatorError> {
    if kind == SessionKind::Normal {
        vmdeploy_shared::iqn::validate(&config.target)?;
    }
    let stream = connect(config).await?;
    let (read, write) = stream.into_split();
    let reader = PduReader::new(read, PduDecoder::new(Digests::NONE, LOGIN_SEGMENT_LIMIT));
    let mut login = Login {
        config,
        reader,
        writer: write,
        isid: random_isid(),
        tsih: 0,
        cmd_sn: 1,
        exp_stat_sn: 0,
        max_cmd_sn: 1,
        target_label: match kind {
            SessionKind::Normal => config.target.clone(),
            SessionKind::Discovery => format!("discovery session at {}", config.portal),
        },
    };
    let mut first = TextKeys::new();
    first.push(key::INITIATOR_NAME, config.initiator_name.clone());
    first.push(key::SESSION_TYPE, kind.session_type());
    if kind == SessionKind::Normal {
        first.push(key::TARGET_NAME, config.target.clone());
    }
    login.security_stage(first).await?;
    let mut local = config.params.clone();
    // One connection, no error recovery: the session logic relies on both (module docs).
    local.max_connections = 1;
    local.error_recovery_level = 0;
    let mut negotiation = Negotiation::new(Role::Initiator, local);
    login.operational_stage(&mut negotiation).await?;
    let params = negotiation.result.clone();
    let digests = params.digests();
    info!(
        target_name = %login.target_label,
        portal = %config.portal,
        tsih = login.tsih,
        max_xmit = params.max_xmit_data_segment_length,
        max_burst = params.max_burst_length,
        first_burst = params.first_burst_length,
        initial_r2t = params.initial_r2t,
        immediate_data = params.immediate_data,
        ?digests,
        "iSCSI login complete"
    );
    let mut reader = login.reader;
    reader.decoder = PduDecoder::new(digests, params.max_recv_data_segment_length as usize);
    Ok(Connected {
        reader,
        writer: login.writer,
        session: LoggedIn {
            kind,
            params,
            initiator_name: config.initiator_name.clone(),
            isid: login.isid,
            tsih: login.tsih,
            cmd_sn: login.cmd_sn,
            max_cmd_sn: login.max_cmd_sn,
            stat_sn: login.exp_stat_sn,
        },
    })
}

/// Runs SendTargets=All on a discovery session and logs out. The portal's targets, in the
/// order the target lists them.
pub async fn discover(config: &SessionConfig) -> Result<Vec<DiscoveredTarget>, InitiatorError> {
    let mut s = login(config, SessionKind::Discovery).await?;
    let limit = config.timeouts.login;
    let mut keys = TextKeys::new();
    keys.push(key::SEND_TARGETS, value::ALL);
    let itt = 1;
    let mut ttt = RESERVED_TAG;
    let mut data = keys.encode();
    let mut collected = Vec::new();
    for _ in 0..MAX_LOGIN_ROUNDS * 16 {
        let request = TextRequest {
            immediate: false,
            final_: true,
            continue_: false,
            itt,
            ttt,
            cmd_sn: s.session.cmd_sn,
            exp_stat_sn: s.session.stat_sn,
            ..Default::default()
        };
        send_pdu(
            &mut s.writer,
            &Pdu::with_data(request, std::mem::take(&mut data)),
            s.session.digests(),
            limit,
        )
        .await?;
        s.session.cmd_sn = s.session.cmd_sn.wrapping_add(1);
        let reply = s
            .reader
            .next_within(limit, "waiting for the SendTargets answer")
            .await?;
        let Bhs::TextResponse(h) = reply.bhs else {
            return Err(InitiatorError::Protocol(format!(
                "expected a text response, got {:?}",
                reply.bhs.opcode()
            )));
        };
        s.session.stat_sn = h.stat_sn.wrapping_add(1);
        collected.extend_from_slice(&reply.data);
        if h.final_ && !h.continue_ {
            break;
        }
        // More to come: ask for it with the target's transfer tag (RFC 7143 §11.10.4).
        ttt = h.ttt;
    }
    let targets = parse_send_targets(&TextKeys::parse(&collected)?);
    logout_inline(&mut s, limit).await?;
    Ok(targets)
}

/// Logs out of a session that has no reader task (discovery).
async fn logout_inline(
    s: &mut Connected,
    limit: std::time::Duration,
) -> Result<(), InitiatorError> {
    let request = LogoutRequest {
        immediate: true,
        reason: logout_reason::CLOSE_SESSION,
        itt: 2,
        cid: CID,
        cmd_sn: s.session.cmd_sn,
        exp_stat_sn: s.session.stat_sn,
    };
    send_pdu(
        &mut s.writer,
        &Pdu::new(request),
        s.session.digests(),
        limit,
    )
    .await?;
    let reply = s
        .reader
        .next_within(limit, "waiting for the logout response")
        .await?;
    match reply.bhs {
        Bhs::LogoutResponse(h) if h.response == logout_response::SUCCESS => {
            shutdown(&mut s.writer).await;
            Ok(())
        }
        other => Err(InitiatorError::Protocol(format!(
            "unexpected answer to logout: {other:?}"
        ))),
    }
}
