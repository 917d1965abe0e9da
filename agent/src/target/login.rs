//! The login phase of one connection (RFC 7143 §6): names, optional CHAP, operational keys.

use std::time::Duration;

use anyhow::Context as _;
use tokio::io::{AsyncRead, AsyncWrite, AsyncWriteExt};
use vmdeploy_shared::iscsi::chap::{self, respond_to_challenge};
use vmdeploy_shared::iscsi::keys::{key, value};
use vmdeploy_shared::iscsi::pdu::ISCSI_VERSION;
use vmdeploy_shared::iscsi::{
    Bhs, ChapChallenge, LoggedIn, LoginResponse, LoginStage, LoginStatus, Negotiation,
    OperationalParams, Pdu, Role, SessionKind, TextKeys,
};

use super::budget::{SessionQuota, MAX_SESSIONS};
use super::framing::{self, Header, Limits};
use super::server::TargetShared;

/// Longest a whole login may take: a connection that does not finish it (one that never sends
/// a PDU, or trickles them) gives its place back (`server::MAX_CONNECTIONS`). Initiators log in
/// in a few round trips.
pub const LOGIN_TIMEOUT: Duration = Duration::from_secs(20);
/// Data segment limit during login (RFC 7143 §13.12: 8192 until negotiated).
const LOGIN_MAX_DATA: usize = 8192;
/// Longest accumulated login text (several PDUs with the C bit).
const LOGIN_MAX_TEXT: usize = 64 * 1024;
/// The one target portal group.
pub const PORTAL_GROUP_TAG: u16 = 1;

enum ChapState {
    NotStarted,
    Chosen,
    Challenged(ChapChallenge),
}

/// Local operational wishes: large PDUs and bursts, unsolicited and immediate data allowed
/// (docs/architecture.md §10 benchmark: throughput needs few, large PDUs).
pub fn local_params() -> OperationalParams {
    OperationalParams {
        max_recv_data_segment_length: super::connection::MAX_RECV_DATA_SEGMENT,
        max_burst_length: (1 << 24) - 1,
        first_burst_length: (1 << 24) - 1,
        initial_r2t: false,
        immediate_data: true,
        max_outstanding_r2t: 1,
        header_digest: false,
        data_digest: false,
        error_recovery_level: 0,
        max_connections: 1,
        ..OperationalParams::default()
    }
}

async fn read_login_pdu<R: AsyncRead + Unpin>(
    r: &mut R,
) -> anyhow::Result<Option<(Header, Bhs, Vec<u8>)>> {
    let limits = Limits::new(LOGIN_MAX_DATA);
    let header = framing::read_header(r, &limits)
        .await
        .context("reading a login PDU")?;
    let Some(header) = header else {
        return Ok(None);
    };
    framing::skip(r, header.layout.ahs_len).await?;
    let data = framing::read_data_vec(r, &header).await?;
    let bhs = Bhs::decode(&header.raw).context("decoding a login-phase PDU")?;
    Ok(Some((header, bhs, data)))
}

/// A completed login.
#[derive(Debug)]
pub struct Admitted {
    /// What was negotiated.
    pub session: LoggedIn,
    /// The session's share of the write buffer budget (none for a discovery session, which
    /// cannot write).
    pub quota: Option<SessionQuota>,
}

/// Runs the login on `stream`, within [`LOGIN_TIMEOUT`]. `Ok(None)`: the initiator went away
/// or was refused (already answered and logged).
pub async fn login<S: AsyncRead + AsyncWrite + Unpin>(
    stream: &mut S,
    shared: &TargetShared,
) -> anyhow::Result<Option<Admitted>> {
    match tokio::time::timeout(LOGIN_TIMEOUT, negotiate(stream, shared)).await {
        Ok(result) => result,
        Err(_) => anyhow::bail!("the login did not complete within {LOGIN_TIMEOUT:?}"),
    }
}

async fn negotiate<S: AsyncRead + AsyncWrite + Unpin>(
    stream: &mut S,
    shared: &TargetShared,
) -> anyhow::Result<Option<Admitted>> {
    let mut neg = Negotiation::new(Role::Target, local_params());
    let mut chap_state = ChapState::NotStarted;
    let mut auth_done = shared.chap.is_none();
    let mut first = true;
    let mut kind = SessionKind::Normal;
    let mut initiator = String::new();
    let mut stat_sn = 0u32;
    let mut text = Vec::new();
    loop {
        let Some((_, bhs, data)) = read_login_pdu(stream).await? else {
            return Ok(None);
        };
        let Bhs::LoginRequest(req) = bhs else {
            anyhow::bail!("expected a Login Request, got {:?}", bhs.opcode());
        };
        if first {
            stat_sn = req.exp_stat_sn;
        }
        let mut resp = LoginResponse {
            transit: false,
            continue_: false,
            current_stage: req.current_stage,
            next_stage: req.current_stage,
            version_max: ISCSI_VERSION,
            version_active: ISCSI_VERSION,
            isid: req.isid,
            tsih: 0,
            itt: req.itt,
            stat_sn,
            exp_cmd_sn: req.cmd_sn,
            max_cmd_sn: req.cmd_sn.wrapping_add(super::outbox::CMD_WINDOW - 1),
            status: LoginStatus::SUCCESS,
        };
        stat_sn = stat_sn.wrapping_add(1);
        text.extend_from_slice(&data);
        if text.len() > LOGIN_MAX_TEXT {
            return send_refusal(
                stream,
                resp,
                LoginStatus::OUT_OF_RESOURCES,
                "login text too long".into(),
            )
            .await;
        }
        if req.continue_ {
            // More text follows (RFC 7143 §6.3): acknowledge with an empty response.
            send(stream, resp, TextKeys::new()).await?;
            continue;
        }
        let keys = match TextKeys::parse(&text) {
            Ok(k) => k,
            Err(e) => {
                return send_refusal(
                    stream,
                    resp,
                    LoginStatus::INITIATOR_ERROR,
                    format!("bad login text: {e}"),
                )
                .await;
            }
        };
        text.clear();
        let mut answers = TextKeys::new();
        if first {
            first = false;
            if req.version_min > ISCSI_VERSION {
                return send_refusal(
                    stream,
                    resp,
                    LoginStatus::UNSUPPORTED_VERSION,
                    "version".into(),
                )
                .await;
            }
            if req.tsih != 0 {
                // MaxConnections=1: no connection can join an existing session.
                return send_refusal(
                    stream,
                    resp,
                    LoginStatus::SESSION_DOES_NOT_EXIST,
                    format!("TSIH {} is not a session here", req.tsih),
                )
                .await;
            }
            let Some(name) = keys.get(key::INITIATOR_NAME) else {
                return send_refusal(
                    stream,
                    resp,
                    LoginStatus::MISSING_PARAMETER,
                    "no InitiatorName".into(),
                )
                .await;
            };
            initiator = name.to_string();
            let session_type = keys.get(key::SESSION_TYPE);
            let Some(asked) = SessionKind::from_session_type(session_type) else {
                let other = session_type.unwrap_or_default();
                return send_refusal(
                    stream,
                    resp,
                    LoginStatus::SESSION_TYPE_NOT_SUPPORTED,
                    format!("session type {other:?}"),
                )
                .await;
            };
            kind = asked;
            if kind == SessionKind::Normal {
                match keys.get(key::TARGET_NAME) {
                    None => {
                        return send_refusal(
                            stream,
                            resp,
                            LoginStatus::MISSING_PARAMETER,
                            "no TargetName".into(),
                        )
                        .await;
                    }
                    Some(t) if !t.eq_ignore_ascii_case(&shared.iqn) => {
                        return send_refusal(
                            stream,
                            resp,
                            LoginStatus::NOT_FOUND,
                            format!("unknown target {t:?}"),
                        )
                        .await;
                    }
                    Some(_) => {}
                }
                answers.push(key::TARGET_PORTAL_GROUP_TAG, PORTAL_GROUP_TAG.to_string());
            }
        }
        match req.current_stage {
            LoginStage::Security => {
                if let Some(methods) = keys.get(key::AUTH_METHOD) {
                    let offered: Vec<&str> = methods.split(',').collect();
                    if shared.chap.is_some() {
                        if offered.contains(&value::CHAP) {
                            answers.push(key::AUTH_METHOD, value::CHAP);
                            chap_state = ChapState::Chosen;
                        } else {
                            return send_refusal(
                                stream,
                                resp,
                                LoginStatus::AUTHENTICATION_FAILURE,
                                "initiator does not offer CHAP".into(),
                            )
                            .await;
                        }
                    } else if offered.contains(&value::NONE) {
                        answers.push(key::AUTH_METHOD, value::NONE);
                    } else {
                        return send_refusal(
                            stream,
                            resp,
                            LoginStatus::AUTHENTICATION_FAILURE,
                            format!("no common AuthMethod in {methods:?}"),
                        )
                        .await;
                    }
                }
                if let Some(creds) = &shared.chap {
                    if let Some(algs) = keys.get(key::CHAP_A) {
                        if !matches!(chap_state, ChapState::Chosen) || !chap::offers_md5(algs) {
                            return send_refusal(
                                stream,
                                resp,
                                LoginStatus::AUTHENTICATION_FAILURE,
                                format!("CHAP_A {algs:?} out of order or without MD5"),
                            )
                            .await;
                        }
                        let challenge =
                            ChapChallenge::generate().context("making a CHAP challenge")?;
                        answers.push(key::CHAP_A, "5");
                        answers.extend(challenge.keys());
                        chap_state = ChapState::Challenged(challenge);
                    } else if keys.contains(key::CHAP_N) || keys.contains(key::CHAP_R) {
                        let ChapState::Challenged(challenge) = &chap_state else {
                            return send_refusal(
                                stream,
                                resp,
                                LoginStatus::AUTHENTICATION_FAILURE,
                                "CHAP response before a challenge".into(),
                            )
                            .await;
                        };
                        if let Err(e) = challenge.check(&keys, creds) {
                            return send_refusal(
                                stream,
                                resp,
                                LoginStatus::AUTHENTICATION_FAILURE,
                                format!("CHAP: {e}"),
                            )
                            .await;
                        }
                        if keys.contains(key::CHAP_I) || keys.contains(key::CHAP_C) {
                            // Mutual CHAP: answer the initiator's challenge with the same
                            // credentials, refusing a reflected challenge (RFC 7143 §12.1.3).
                            let reflected = keys
                                .get(key::CHAP_C)
                                .and_then(|c| chap::parse_binary(key::CHAP_C, c).ok())
                                .is_some_and(|c| c == challenge.challenge);
                            let reply = if reflected {
                                Err(chap::ChapError::ReflectedChallenge)
                            } else {
                                respond_to_challenge(&keys, creds, None)
                            };
                            match reply {
                                Ok(k) => answers.extend(k),
                                Err(e) => {
                                    return send_refusal(
                                        stream,
                                        resp,
                                        LoginStatus::AUTHENTICATION_FAILURE,
                                        format!("mutual CHAP: {e}"),
                                    )
                                    .await;
                                }
                            }
                        }
                        auth_done = true;
                    }
                }
            }
            LoginStage::Operational => {
                if !auth_done {
                    return send_refusal(
                        stream,
                        resp,
                        LoginStatus::AUTHENTICATION_FAILURE,
                        "operational stage without CHAP".into(),
                    )
                    .await;
                }
            }
            LoginStage::FullFeature => {
                return send_refusal(
                    stream,
                    resp,
                    LoginStatus::INITIATOR_ERROR,
                    "login PDU in full feature stage".into(),
                )
                .await;
            }
        }
        // Operational keys, in either stage (they may already come in the security stage).
        match neg.receive(&keys) {
            Ok(a) => answers.extend(a),
            Err(e) => {
                return send_refusal(
                    stream,
                    resp,
                    LoginStatus::INITIATOR_ERROR,
                    format!("negotiation: {e}"),
                )
                .await;
            }
        }
        let next = req.next_stage;
        if req.transit
            && auth_done
            && next != LoginStage::Security
            && next as u8 > req.current_stage as u8
        {
            resp.transit = true;
            resp.next_stage = next;
            if next == LoginStage::FullFeature {
                // Admitted only with a share of the write budget: past MAX_SESSIONS, another
                // session would take the memory the ones logged in count on.
                let quota = match kind {
                    SessionKind::Normal => match shared.budget.admit() {
                        Some(q) => Some(q),
                        None => {
                            return send_refusal(
                                stream,
                                resp,
                                LoginStatus::OUT_OF_RESOURCES,
                                format!("{MAX_SESSIONS} sessions are logged in already"),
                            )
                            .await;
                        }
                    },
                    SessionKind::Discovery => None,
                };
                answers.extend(neg.offer());
                let tsih = shared.next_tsih();
                resp.tsih = tsih;
                let max_cmd_sn = resp.max_cmd_sn;
                send(stream, resp, answers).await?;
                let mut params = neg.result.clone();
                // The digests this target uses are always None (it never offers or accepts CRC32C).
                params.header_digest = false;
                params.data_digest = false;
                let session = LoggedIn {
                    kind,
                    params,
                    initiator_name: initiator,
                    isid: req.isid,
                    tsih,
                    cmd_sn: req.cmd_sn,
                    max_cmd_sn,
                    stat_sn,
                };
                return Ok(Some(Admitted { session, quota }));
            }
        }
        send(stream, resp, answers).await?;
    }
}

async fn send<S: AsyncWrite + Unpin>(
    stream: &mut S,
    resp: LoginResponse,
    keys: TextKeys,
) -> anyhow::Result<()> {
    let wire = Pdu::with_data(resp, keys.encode())
        .encode(vmdeploy_shared::iscsi::Digests::NONE)
        .context("encoding a Login Response")?;
    stream
        .write_all(&wire)
        .await
        .context("sending a Login Response")?;
    stream.flush().await.context("flushing a Login Response")?;
    Ok(())
}

/// Answers the login with `status` (no stage transition, no keys), logs why, and ends the login.
async fn send_refusal<S: AsyncWrite + Unpin>(
    stream: &mut S,
    mut resp: LoginResponse,
    status: LoginStatus,
    reason: String,
) -> anyhow::Result<Option<Admitted>> {
    resp.status = status;
    resp.transit = false;
    let status = resp.status.description();
    tracing::warn!(%reason, status, "login refused");
    send(stream, resp, TextKeys::new()).await?;
    Ok(None)
}
