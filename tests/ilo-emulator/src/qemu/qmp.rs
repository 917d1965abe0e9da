//! A QMP client (QEMU Machine Protocol) over QEMU's unix socket.
//!
//! # Design
//! QMP is one JSON object per line in each direction (QEMU ends its lines with `\r\n`). After
//! connecting, QEMU sends a greeting (`{"QMP": ...}`); the client must send `qmp_capabilities`
//! before anything else. Each command may carry an `id`, which QEMU copies into its
//! `{"return": ...}` or `{"error": {"class", "desc"}}` answer; events (`{"event": NAME, "data":
//! ...}`) arrive at any time in between (docs/qemu-and-boot.md §7).
//!
//! The wire format is handled by two pure functions ([`encode_command`], [`parse_line`]); the
//! [`Qmp`] connection owns a reader task that routes answers to the waiting command by id and
//! events to a channel. Every command has a timeout, so a hung QEMU can never hang the emulator:
//! the caller then kills the process.

use std::collections::HashMap;
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde_json::{json, Value};
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::net::unix::OwnedWriteHalf;
use tokio::net::UnixStream;
use tokio::sync::{mpsc, oneshot};
use vmdeploy_shared::error::Chain;
use vmdeploy_shared::redact::Url;

/// A QMP failure.
#[derive(Debug, thiserror::Error)]
pub enum QmpError {
    /// The socket could not be opened or written.
    #[error("QMP socket {path}: {reason}")]
    Connect {
        /// Socket path.
        path: String,
        /// Why.
        reason: String,
    },
    /// QEMU closed the connection (it exited).
    #[error("QMP connection closed (QEMU exited)")]
    Closed,
    /// No answer in time.
    #[error("QMP command {command} got no answer within {timeout:?}")]
    Timeout {
        /// The command.
        command: String,
        /// How long it waited.
        timeout: Duration,
    },
    /// QEMU refused the command.
    #[error("QMP command {command} failed: {class}: {desc}")]
    Command {
        /// The command.
        command: String,
        /// QMP error class (`GenericError`, `DeviceNotFound`, ...).
        class: String,
        /// QEMU's message.
        desc: String,
    },
    /// A line that is not a QMP message.
    #[error("malformed QMP message {line:?}: {reason}")]
    Malformed {
        /// The line (shortened).
        line: String,
        /// Why.
        reason: String,
    },
}

/// One message from QEMU.
#[derive(Debug, Clone, PartialEq)]
pub enum Incoming {
    /// The greeting sent on connect.
    Greeting(Value),
    /// A successful answer.
    Return {
        /// The command id it answers (absent when the command had none).
        id: Option<u64>,
        /// The `return` value.
        value: Value,
    },
    /// A failed command.
    Error {
        /// The command id it answers.
        id: Option<u64>,
        /// Error class.
        class: String,
        /// Message.
        desc: String,
    },
    /// An asynchronous event.
    Event(QmpEvent),
}

/// An asynchronous QMP event (`SHUTDOWN`, `STOP`, `RESET`, `DEVICE_DELETED`, ...).
#[derive(Debug, Clone, PartialEq)]
pub struct QmpEvent {
    /// Event name.
    pub name: String,
    /// Event data (`Null` when absent).
    pub data: Value,
}

/// The line that sends `command` with `arguments` (an object or `Null`) and `id`.
pub fn encode_command(id: u64, command: &str, arguments: &Value) -> String {
    let mut msg = json!({ "execute": command, "id": id });
    if !arguments.is_null() {
        msg["arguments"] = arguments.clone();
    }
    let mut line = msg.to_string();
    line.push('\n');
    line
}

fn shorten(line: &str) -> String {
    line.chars().take(200).collect()
}

/// Parses one line from QEMU.
pub fn parse_line(line: &str) -> Result<Incoming, QmpError> {
    let malformed = |reason: &str| QmpError::Malformed {
        line: shorten(line),
        reason: reason.to_owned(),
    };
    let value: Value =
        serde_json::from_str(line.trim()).map_err(|e| malformed(&format!("not JSON: {e}")))?;
    let Some(obj) = value.as_object() else {
        return Err(malformed("not a JSON object"));
    };
    let id = obj.get("id").and_then(Value::as_u64);
    if let Some(greeting) = obj.get("QMP") {
        return Ok(Incoming::Greeting(greeting.clone()));
    }
    if let Some(ret) = obj.get("return") {
        return Ok(Incoming::Return {
            id,
            value: ret.clone(),
        });
    }
    if let Some(err) = obj.get("error") {
        let field = |k: &str| {
            err.get(k)
                .and_then(Value::as_str)
                .unwrap_or_default()
                .to_owned()
        };
        return Ok(Incoming::Error {
            id,
            class: field("class"),
            desc: field("desc"),
        });
    }
    if let Some(name) = obj.get("event").and_then(Value::as_str) {
        return Ok(Incoming::Event(QmpEvent {
            name: name.to_owned(),
            data: obj.get("data").cloned().unwrap_or(Value::Null),
        }));
    }
    Err(malformed("neither greeting, return, error nor event"))
}

type Waiters = Arc<Mutex<Option<HashMap<u64, oneshot::Sender<Result<Value, QmpError>>>>>>;

/// A live QMP connection.
pub struct Qmp {
    writer: tokio::sync::Mutex<OwnedWriteHalf>,
    waiters: Waiters,
    next_id: AtomicU64,
}

impl std::fmt::Debug for Qmp {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Qmp").finish_non_exhaustive()
    }
}

/// How long one command may take by default.
pub const COMMAND_TIMEOUT: Duration = Duration::from_secs(20);

impl Qmp {
    /// Connects to `path`, retrying until `timeout` (QEMU creates the socket a moment after it
    /// starts), reads the greeting and negotiates capabilities. Events go to the returned
    /// receiver, which ends when QEMU closes the connection.
    pub async fn connect(
        path: &Path,
        timeout: Duration,
    ) -> Result<(Arc<Qmp>, mpsc::UnboundedReceiver<QmpEvent>), QmpError> {
        let deadline = tokio::time::Instant::now() + timeout;
        let stream = loop {
            match UnixStream::connect(path).await {
                Ok(s) => break s,
                Err(e) if tokio::time::Instant::now() >= deadline => {
                    return Err(QmpError::Connect {
                        path: path.display().to_string(),
                        reason: e.to_string(),
                    })
                }
                Err(_) => tokio::time::sleep(Duration::from_millis(50)).await,
            }
        };
        let (read, write) = stream.into_split();
        let mut lines = BufReader::new(read).lines();
        // The greeting comes first.
        let greeting = tokio::time::timeout_at(deadline, lines.next_line())
            .await
            .map_err(|_| QmpError::Timeout {
                command: "greeting".into(),
                timeout,
            })?
            .map_err(|e| QmpError::Connect {
                path: path.display().to_string(),
                reason: e.to_string(),
            })?
            .ok_or(QmpError::Closed)?;
        match parse_line(&greeting)? {
            Incoming::Greeting(_) => {}
            other => {
                return Err(QmpError::Malformed {
                    line: shorten(&greeting),
                    reason: format!("expected the greeting, got {other:?}"),
                })
            }
        }
        let waiters: Waiters = Arc::new(Mutex::new(Some(HashMap::new())));
        let (events_tx, events_rx) = mpsc::unbounded_channel();
        let reader_waiters = waiters.clone();
        tokio::spawn(async move {
            loop {
                let line = match lines.next_line().await {
                    Ok(Some(line)) => line,
                    Ok(None) | Err(_) => break,
                };
                if line.trim().is_empty() {
                    continue;
                }
                match parse_line(&line) {
                    Ok(Incoming::Event(ev)) => {
                        tracing::debug!(event = %ev.name, data = %ev.data, "QMP event");
                        let _ = events_tx.send(ev);
                    }
                    Ok(Incoming::Return {
                        id: Some(id),
                        value,
                    }) => {
                        deliver(&reader_waiters, id, Ok(value));
                    }
                    Ok(Incoming::Error {
                        id: Some(id),
                        class,
                        desc,
                    }) => deliver(
                        &reader_waiters,
                        id,
                        Err(QmpError::Command {
                            command: String::new(),
                            class,
                            desc,
                        }),
                    ),
                    Ok(other) => tracing::debug!(?other, "QMP message without an id ignored"),
                    Err(e) => tracing::warn!(error = %Chain(&e), "QMP"),
                }
            }
            // QEMU is gone: fail every waiting command, refuse new ones.
            if let Ok(mut w) = reader_waiters.lock() {
                if let Some(map) = w.take() {
                    for (_, tx) in map {
                        let _ = tx.send(Err(QmpError::Closed));
                    }
                }
            }
        });
        let qmp = Arc::new(Qmp {
            writer: tokio::sync::Mutex::new(write),
            waiters,
            next_id: AtomicU64::new(1),
        });
        let left = deadline.saturating_duration_since(tokio::time::Instant::now());
        qmp.execute_with_timeout(
            "qmp_capabilities",
            Value::Null,
            left.max(Duration::from_secs(1)),
        )
        .await?;
        Ok((qmp, events_rx))
    }

    /// Runs `command` with `arguments` (an object, or `Null` for none), [`COMMAND_TIMEOUT`].
    pub async fn execute(&self, command: &str, arguments: Value) -> Result<Value, QmpError> {
        self.execute_with_timeout(command, arguments, COMMAND_TIMEOUT)
            .await
    }

    /// Runs `command` and waits up to `timeout` for its answer.
    pub async fn execute_with_timeout(
        &self,
        command: &str,
        arguments: Value,
        timeout: Duration,
    ) -> Result<Value, QmpError> {
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let (tx, rx) = oneshot::channel();
        {
            let mut w = self.waiters.lock().map_err(|_| QmpError::Closed)?;
            match w.as_mut() {
                Some(map) => map.insert(id, tx),
                None => return Err(QmpError::Closed),
            };
        }
        let line = encode_command(id, command, &arguments);
        tracing::debug!(command, arguments = %Url(&arguments.to_string()), "QMP command");
        let written = tokio::time::timeout(timeout, async {
            let mut w = self.writer.lock().await;
            w.write_all(line.as_bytes()).await?;
            w.flush().await
        })
        .await;
        let failed = match written {
            Ok(Ok(())) => None,
            Ok(Err(_)) => Some(QmpError::Closed),
            Err(_) => Some(QmpError::Timeout {
                command: command.to_owned(),
                timeout,
            }),
        };
        if let Some(e) = failed {
            self.forget(id);
            return Err(e);
        }
        match tokio::time::timeout(timeout, rx).await {
            Ok(Ok(Ok(v))) => Ok(v),
            Ok(Ok(Err(QmpError::Command { class, desc, .. }))) => Err(QmpError::Command {
                command: command.to_owned(),
                class,
                desc,
            }),
            Ok(Ok(Err(e))) => Err(e),
            Ok(Err(_)) => Err(QmpError::Closed),
            Err(_) => {
                self.forget(id);
                Err(QmpError::Timeout {
                    command: command.to_owned(),
                    timeout,
                })
            }
        }
    }

    fn forget(&self, id: u64) {
        if let Ok(mut w) = self.waiters.lock() {
            if let Some(map) = w.as_mut() {
                map.remove(&id);
            }
        }
    }
}

fn deliver(waiters: &Waiters, id: u64, result: Result<Value, QmpError>) {
    let tx = waiters
        .lock()
        .ok()
        .and_then(|mut w| w.as_mut().and_then(|m| m.remove(&id)));
    match tx {
        Some(tx) => {
            let _ = tx.send(result);
        }
        None => tracing::debug!(id, "QMP answer for a command nobody waits for"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn commands_are_one_line_with_id_and_optional_arguments() {
        assert_eq!(
            encode_command(7, "query-status", &Value::Null),
            "{\"execute\":\"query-status\",\"id\":7}\n"
        );
        let line = encode_command(8, "eject", &json!({"id": "vcd", "force": true}));
        assert!(line.ends_with('\n') && !line[..line.len() - 1].contains('\n'));
        let back: Value = serde_json::from_str(&line).expect("JSON");
        assert_eq!(back["arguments"]["id"], "vcd");
        assert_eq!(back["id"], 8);
    }

    #[test]
    fn parses_greeting_returns_errors_and_events() {
        assert!(matches!(
            parse_line(r#"{"QMP": {"version": {"qemu": {"major": 10}}, "capabilities": []}}"#),
            Ok(Incoming::Greeting(_))
        ));
        assert_eq!(
            parse_line("{\"return\": {}, \"id\": 3}\r\n").expect("return"),
            Incoming::Return {
                id: Some(3),
                value: json!({})
            }
        );
        assert_eq!(
            parse_line(r#"{"id": 4, "error": {"class": "GenericError", "desc": "curl driver does not support writes"}}"#)
                .expect("error"),
            Incoming::Error {
                id: Some(4),
                class: "GenericError".into(),
                desc: "curl driver does not support writes".into()
            }
        );
        let ev = parse_line(r#"{"timestamp": {"seconds": 1, "microseconds": 2}, "event": "SHUTDOWN", "data": {"guest": true, "reason": "guest-shutdown"}}"#)
            .expect("event");
        assert_eq!(
            ev,
            Incoming::Event(QmpEvent {
                name: "SHUTDOWN".into(),
                data: json!({"guest": true, "reason": "guest-shutdown"})
            })
        );
        assert_eq!(
            parse_line(r#"{"event": "STOP"}"#).expect("event"),
            Incoming::Event(QmpEvent {
                name: "STOP".into(),
                data: Value::Null
            })
        );
    }

    #[test]
    fn rejects_what_is_not_qmp() {
        for bad in [
            "",
            "[1,2]",
            "{\"hello\": 1}",
            "{\"return\": ",
            "garbage\u{0}",
        ] {
            assert!(
                matches!(parse_line(bad), Err(QmpError::Malformed { .. })),
                "{bad:?}"
            );
        }
    }

    /// A fake QEMU on a socket pair: answers out of order, interleaves an event, then hangs.
    #[tokio::test]
    async fn routes_answers_by_id_events_to_the_channel_and_times_out() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("qmp.sock");
        let listener = tokio::net::UnixListener::bind(&path).expect("bind");
        let fake = tokio::spawn(async move {
            let (stream, _) = listener.accept().await.expect("accept");
            let (read, mut write) = stream.into_split();
            let mut lines = BufReader::new(read).lines();
            write
                .write_all(b"{\"QMP\": {\"version\": {}, \"capabilities\": []}}\r\n")
                .await
                .expect("greeting");
            let caps = lines.next_line().await.expect("read").expect("line");
            let caps: Value = serde_json::from_str(&caps).expect("json");
            assert_eq!(caps["execute"], "qmp_capabilities");
            write
                .write_all(format!("{{\"return\": {{}}, \"id\": {}}}\r\n", caps["id"]).as_bytes())
                .await
                .expect("caps answer");
            let a: Value =
                serde_json::from_str(&lines.next_line().await.expect("r").expect("l")).expect("j");
            let b: Value =
                serde_json::from_str(&lines.next_line().await.expect("r").expect("l")).expect("j");
            // b first, an event, then a as an error.
            write
                .write_all(
                    format!(
                        "{{\"return\": {{\"status\": \"running\"}}, \"id\": {}}}\r\n\
                         {{\"event\": \"RESET\", \"data\": {{\"guest\": true}}}}\r\n\
                         {{\"error\": {{\"class\": \"DeviceNotFound\", \"desc\": \"no vfd\"}}, \"id\": {}}}\r\n",
                        b["id"], a["id"]
                    )
                    .as_bytes(),
                )
                .await
                .expect("answers");
            // Read the next command and never answer it; then hang up.
            let _ = lines.next_line().await;
            tokio::time::sleep(Duration::from_millis(300)).await;
        });
        let (qmp, mut events) = Qmp::connect(&path, Duration::from_secs(5))
            .await
            .expect("connect");
        let (a, b) = tokio::join!(qmp.execute("device_del", json!({"id": "vfd"})), async {
            tokio::time::sleep(Duration::from_millis(50)).await;
            qmp.execute("query-status", Value::Null).await
        });
        match a {
            Err(QmpError::Command { command, class, .. }) => {
                assert_eq!(command, "device_del");
                assert_eq!(class, "DeviceNotFound");
            }
            other => panic!("expected a command error, got {other:?}"),
        }
        assert_eq!(b.expect("query-status")["status"], "running");
        let ev = events.recv().await.expect("event");
        assert_eq!(ev.name, "RESET");
        let hung = qmp
            .execute_with_timeout("cont", Value::Null, Duration::from_millis(100))
            .await;
        assert!(matches!(hung, Err(QmpError::Timeout { .. })), "{hung:?}");
        fake.await.expect("fake QEMU");
        // The fake hung up: the event stream ends and commands fail at once.
        assert!(events.recv().await.is_none());
        assert!(matches!(
            qmp.execute("cont", Value::Null).await,
            Err(QmpError::Closed)
        ));
    }
}
