//! The test-only admin API of each emulated iLO, on the same port, under `/_emulator/`:
//!
//! - `POST /_emulator/faults` `{"kind": ..., "count": N, "seconds": S}` queues a fault for the next
//!   N requests (optional `status`/`message` override the RIBCL status of `ribcl_error`/`busy`);
//! - `GET /_emulator/faults` lists queued faults; `DELETE /_emulator/faults` drops them;
//! - `GET /_emulator/state` returns the server's state as JSON, with what the backend says about
//!   its machine under `"machine"` (QEMU: pid, serial log, disk, forwarded ports, firmware);
//! - `GET /_emulator/console?tail=N` returns the machine's serial console log (the last `N`
//!   bytes, default and at most [`CONSOLE_TAIL_MAX`]); 404 when the backend has no console.
//!
//! Admin requests need no credentials, are not counted and never hit a fault.

use http::{Method, Request, StatusCode};
use hyper::body::Incoming;
use serde_json::json;

use crate::fault::FaultSpec;
use crate::http::{read_body, simple, Reply};
use crate::server::{Server, ServerSnapshot};

/// The most of the console log one request returns.
pub const CONSOLE_TAIL_MAX: u64 = 4 << 20;

/// The last `tail` bytes of the file at `path`.
async fn read_tail(path: &std::path::Path, tail: u64) -> std::io::Result<Vec<u8>> {
    use tokio::io::{AsyncReadExt, AsyncSeekExt};
    let mut file = tokio::fs::File::open(path).await?;
    let len = file.metadata().await?.len();
    file.seek(std::io::SeekFrom::Start(len.saturating_sub(tail)))
        .await?;
    let mut out = Vec::new();
    file.take(tail).read_to_end(&mut out).await?;
    Ok(out)
}

/// The `tail` query parameter (bytes), capped.
fn tail_param(query: Option<&str>) -> u64 {
    query
        .into_iter()
        .flat_map(|q| q.split('&'))
        .find_map(|kv| kv.strip_prefix("tail="))
        .and_then(|v| v.parse::<u64>().ok())
        .map_or(CONSOLE_TAIL_MAX, |t| t.min(CONSOLE_TAIL_MAX))
}

fn json_reply(status: StatusCode, value: &serde_json::Value) -> Reply {
    simple(status, "application/json", format!("{value}\n"))
}

/// The state document of `GET /_emulator/state`.
pub fn state_json(s: &ServerSnapshot) -> serde_json::Value {
    let st = &s.state;
    let vm = |d: crate::state::VmDevice| {
        let v = st.vm(d);
        json!({
            "url": v.url,
            "inserted": v.inserted(),
            "connected": v.connected,
            "boot_option": v.boot_option.ribcl(),
            "write_protect": v.write_protect,
            "image_size": v.image_size,
        })
    };
    json!({
        "index": s.index,
        "address": s.address.to_string(),
        "product": s.product,
        "uuid": s.uuid,
        "power": match st.power { crate::state::Power::On => "ON", crate::state::Power::Off => "OFF" },
        "boot_mode": {
            "current": st.boot_mode_current.ribcl(),
            "pending": st.boot_mode_pending.ribcl(),
            "supported": st.supported_boot_modes.ribcl(),
        },
        "secure_boot": {"enable": st.secure_boot_enable, "current": st.secure_boot_current},
        "one_time_boot": st.one_time_boot.map(|o| o.ribcl()),
        "persistent_boot": st.persistent_boot.iter().map(|d| d.ribcl()).collect::<Vec<_>>(),
        "vmedia": {
            "FLOPPY": vm(crate::state::VmDevice::Floppy),
            "CDROM": vm(crate::state::VmDevice::Cdrom),
        },
        "license": st.license,
        "boots": st.boots,
        "last_boot": st.last_boot.as_ref().map(|b| json!({
            "device": b.device.map(|d| d.ribcl()),
            "reason": b.reason,
            "mode": b.mode.ribcl(),
            "media_url": b.media_url,
            "media_read_error": b.media_read_error,
            "media_read": b.media_read,
        })),
        "last_media_read": st.last_media_read,
        "requests": s.requests,
        "sessions": {"live": s.sessions_live, "opened": s.sessions_opened},
        "faults_pending": s.faults_pending,
        "machine": s.machine,
    })
}

/// Handles a `/_emulator/...` request.
pub async fn handle(server: &Server, req: Request<Incoming>) -> Reply {
    let path = req.uri().path().to_owned();
    let method = req.method().clone();
    tracing::debug!(server = server.index, %method, %path, "admin request");
    match (method, path.as_str()) {
        (Method::GET, "/_emulator/state") => {
            json_reply(StatusCode::OK, &state_json(&server.snapshot().await))
        }
        (Method::GET, "/_emulator/console") => match server.console_log() {
            None => json_reply(
                StatusCode::NOT_FOUND,
                &json!({ "error": "this backend has no serial console" }),
            ),
            Some(path) => match read_tail(&path, tail_param(req.uri().query())).await {
                Ok(bytes) => simple(StatusCode::OK, "text/plain; charset=utf-8", bytes),
                // No boot yet: an empty console.
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                    simple(StatusCode::OK, "text/plain; charset=utf-8", Vec::new())
                }
                Err(e) => json_reply(
                    StatusCode::INTERNAL_SERVER_ERROR,
                    &json!({ "error": format!("reading {}: {e}", path.display()) }),
                ),
            },
        },
        (Method::POST, "/_emulator/faults") => {
            let body = match read_body(req.into_body()).await {
                Ok(b) => b,
                Err(reply) => return reply,
            };
            match serde_json::from_slice::<FaultSpec>(&body) {
                Ok(spec) => {
                    server.inject_fault(spec);
                    json_reply(
                        StatusCode::OK,
                        &json!({ "faults_pending": server.snapshot().await.faults_pending }),
                    )
                }
                Err(e) => json_reply(
                    StatusCode::BAD_REQUEST,
                    &json!({ "error": format!("invalid fault: {e}") }),
                ),
            }
        }
        (Method::PUT, "/_emulator/license") => {
            // The licence an operator finds installed: `{"license": "standard"|"advanced"}`.
            let body = match read_body(req.into_body()).await {
                Ok(b) => b,
                Err(reply) => return reply,
            };
            let wanted = serde_json::from_slice::<serde_json::Value>(&body)
                .ok()
                .and_then(|v| v.get("license").and_then(|l| l.as_str()).map(str::to_owned));
            let license = match wanted.as_deref() {
                Some("standard") => crate::state::License::Standard,
                Some("advanced") => crate::state::License::Advanced,
                _ => {
                    return json_reply(
                        StatusCode::BAD_REQUEST,
                        &json!({ "error": "expected {\"license\": \"standard\"|\"advanced\"}" }),
                    )
                }
            };
            server.update(|s| s.license = license).await;
            json_reply(StatusCode::OK, &json!({ "license": wanted }))
        }
        (Method::PUT, "/_emulator/bios-reject") => {
            // Every pending boot-mode change is refused at boot with this message id until
            // cleared: `{"message_id": "iLO.2.15.SomeRefusal"}`, `{"message_id": null}` clears.
            let body = match read_body(req.into_body()).await {
                Ok(b) => b,
                Err(reply) => return reply,
            };
            let Some(id) = serde_json::from_slice::<serde_json::Value>(&body)
                .ok()
                .and_then(|v| v.get("message_id").cloned())
                .and_then(|i| match i {
                    serde_json::Value::Null => Some(None),
                    serde_json::Value::String(s) => Some(Some(s)),
                    _ => None,
                })
            else {
                return json_reply(
                    StatusCode::BAD_REQUEST,
                    &json!({ "error": "expected {\"message_id\": \"...\" | null}" }),
                );
            };
            server.update(|s| s.bios_reject = id.clone()).await;
            json_reply(StatusCode::OK, &json!({ "bios_reject": id }))
        }
        (Method::POST, "/_emulator/iml") => {
            // An IML entry recorded now, as the firmware would: `{"severity": "Critical",
            // "message": "..."}` (tests of IML readers without a machine to refuse a loader).
            let body = match read_body(req.into_body()).await {
                Ok(b) => b,
                Err(reply) => return reply,
            };
            let parsed = serde_json::from_slice::<serde_json::Value>(&body).ok();
            let field = |key: &str| {
                parsed
                    .as_ref()
                    .and_then(|v| v.get(key))
                    .and_then(|v| v.as_str())
                    .map(str::to_owned)
            };
            let severity = match field("severity").as_deref() {
                Some("OK") => "OK",
                Some("Warning") => "Warning",
                Some("Critical") => "Critical",
                _ => {
                    return json_reply(
                        StatusCode::BAD_REQUEST,
                        &json!({ "error": "expected {\"severity\": \"OK\"|\"Warning\"|\"Critical\", \"message\": \"...\"}" }),
                    )
                }
            };
            let Some(message) = field("message") else {
                return json_reply(
                    StatusCode::BAD_REQUEST,
                    &json!({ "error": "expected a \"message\"" }),
                );
            };
            let id = server.record_iml(severity, message);
            json_reply(StatusCode::OK, &json!({ "id": id }))
        }
        (Method::GET, "/_emulator/faults") => json_reply(
            StatusCode::OK,
            &json!({ "faults_pending": server.snapshot().await.faults_pending }),
        ),
        (Method::DELETE, "/_emulator/faults") => {
            server.clear_faults();
            json_reply(StatusCode::OK, &json!({ "faults_pending": [] }))
        }
        _ => json_reply(
            StatusCode::NOT_FOUND,
            &json!({ "error": format!("no admin resource {path}") }),
        ),
    }
}
