//! `done`: the conductor tells the iSCSI ramdisk the image is written (ironic-protocols.md
//! §2.4): one TCP connection to its port 10000 carrying the four bytes `done`, after which the
//! ramdisk stops its target and powers off (or waits for the reboot).

use std::net::{IpAddr, SocketAddr};
use std::time::Duration;

use anyhow::bail;
use tokio::io::AsyncWriteExt;

/// How often `done` is tried before the deploy fails (the ramdisk may be a moment late to
/// listen, as Ironic's 3 s sleep before it allows for).
const DONE_ATTEMPTS: u32 = 5;
/// The wait between two `done` attempts.
const DONE_RETRY: Duration = Duration::from_secs(1);
/// Time allowed to connect to the ramdisk and send `done`.
const DONE_TIMEOUT: Duration = Duration::from_secs(10);

/// Tells the ramdisk to go on: a TCP connection to its port 10000 carrying `done`
/// (ironic-protocols.md §2.4), tried a few times.
pub async fn notify_done(address: IpAddr, port: u16) -> anyhow::Result<()> {
    let target = SocketAddr::new(address, port);
    let mut last = None;
    for attempt in 1..=DONE_ATTEMPTS {
        let sent = tokio::time::timeout(DONE_TIMEOUT, async {
            let mut stream = tokio::net::TcpStream::connect(target).await?;
            stream.write_all(b"done").await?;
            stream.shutdown().await
        })
        .await;
        match sent {
            Ok(Ok(())) => return Ok(()),
            Ok(Err(e)) => last = Some(e.to_string()),
            Err(_) => last = Some(format!("no answer within {DONE_TIMEOUT:?}")),
        }
        tracing::warn!(%target, attempt, error = last.as_deref().unwrap_or(""), "telling the ramdisk done failed");
        if attempt < DONE_ATTEMPTS {
            tokio::time::sleep(DONE_RETRY).await;
        }
    }
    bail!(
        "the ramdisk at {target} did not take \"done\" after {DONE_ATTEMPTS} attempts: {}",
        last.unwrap_or_default()
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn done_reaches_a_listener_and_a_closed_port_fails_with_the_address() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind");
        let port = listener.local_addr().expect("addr").port();
        let got = tokio::spawn(async move {
            let (mut stream, _) = listener.accept().await.expect("accept");
            let mut buf = Vec::new();
            tokio::io::AsyncReadExt::read_to_end(&mut stream, &mut buf)
                .await
                .expect("read");
            buf
        });
        notify_done(IpAddr::from([127, 0, 0, 1]), port)
            .await
            .expect("done sent");
        assert_eq!(got.await.expect("listener task"), b"done");

        // A port nobody listens on: every attempt is refused.
        let closed = {
            let l = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
            l.local_addr().expect("addr").port()
        };
        let err = notify_done(IpAddr::from([127, 0, 0, 1]), closed)
            .await
            .expect_err("nobody listens");
        assert!(
            format!("{err:#}").contains(&format!("127.0.0.1:{closed}")),
            "{err:#}"
        );
    }
}
