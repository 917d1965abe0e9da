//! The ramdisk's "done" listener (docs/ironic-protocols.md §2.4): the conductor connects to
//! TCP port 10000 and sends `done` (4 bytes, no newline, no reply read). Like the DIB ramdisk's
//! `nc -l -p 10000`, any connection counts; the payload is only logged.

use std::time::Duration;

use anyhow::Context as _;
use tokio::io::AsyncReadExt;
use tokio::net::TcpListener;

/// How long to wait for the payload after the connection arrived.
const PAYLOAD_WAIT: Duration = Duration::from_secs(5);

/// Waits for one connection on `listener`, reads what it sends (up to a few bytes) and returns.
pub async fn wait_for_done(listener: TcpListener) -> anyhow::Result<()> {
    let (mut stream, peer) = listener
        .accept()
        .await
        .context("accepting the done notification")?;
    let mut buf = [0u8; 16];
    let mut got = 0;
    let read = tokio::time::timeout(PAYLOAD_WAIT, async {
        while got < buf.len() {
            match stream.read(&mut buf[got..]).await {
                Ok(0) | Err(_) => break,
                Ok(n) => {
                    got += n;
                    if buf[..got].starts_with(b"done") {
                        break;
                    }
                }
            }
        }
    })
    .await;
    let payload = String::from_utf8_lossy(&buf[..got]);
    tracing::info!(%peer, payload = %payload.escape_debug(), timed_out = read.is_err(), "done notification received");
    Ok(())
}
