//! `done`: the conductor tells the iSCSI ramdisk the image is written (docs/ironic-protocols.md
//! §2.4): one TCP connection to its port 10000 carrying the four bytes `done`, after which the
//! ramdisk stops its target and powers off (or waits for the reboot).
//!
//! # Design
//! Ironic sleeps 3 s (for `nc` to be listening), connects once, and fails the deploy if that
//! fails. Our agent listens before it calls back, so the first try goes at once; a ramdisk that
//! is late to listen (DIB's `nc` starts after its `curl`) or a connection lost on the way gets
//! a few more tries, Ironic's 3 s apart, and then the deploy fails: never an unbounded wait.

use std::net::{IpAddr, SocketAddr};

use anyhow::bail;
use tokio::io::AsyncWriteExt;

pub use crate::context::DonePolicy;

/// Tells the ramdisk at `address:port` to go on: a TCP connection carrying `done`
/// (docs/ironic-protocols.md §2.4), tried as `policy` says.
pub async fn notify_done(address: IpAddr, port: u16, policy: &DonePolicy) -> anyhow::Result<()> {
    let target = SocketAddr::new(address, port);
    let retry = policy.retry();
    let attempts = retry.max_attempts();
    let outcome = retry
        .run(
            // Whatever failed, nothing was done yet: the ramdisk acts on a complete "done".
            |_| true,
            |_| {},
            |attempt| async move {
                let sent = tokio::time::timeout(policy.timeout, async {
                    let mut stream = tokio::net::TcpStream::connect(target).await?;
                    stream.write_all(b"done").await?;
                    stream.shutdown().await
                })
                .await;
                let failure = match sent {
                    Ok(Ok(())) => {
                        tracing::info!(%target, attempt, "done sent to the ramdisk");
                        return Ok(());
                    }
                    Ok(Err(e)) if e.kind() == std::io::ErrorKind::ConnectionRefused => {
                        "connection refused (nothing listens for done)".to_string()
                    }
                    Ok(Err(e)) => e.to_string(),
                    Err(_) => format!("no answer within {:?}", policy.timeout),
                };
                // Every failure is logged, the last one too.
                tracing::warn!(%target, attempt, attempts, error = %failure, "telling the ramdisk done failed");
                Err(failure)
            },
        )
        .await;
    match outcome {
        Ok(()) => Ok(()),
        Err(e) => {
            let last = e.into_last().unwrap_or_default();
            bail!(
                "the ramdisk at {target} did not take \"done\" after {attempts} attempts {:?} apart: {last}",
                policy.retry_interval
            )
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    const QUICK: DonePolicy = DonePolicy {
        attempts: 3,
        retry_interval: Duration::from_millis(20),
        timeout: Duration::from_secs(5),
    };

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
        notify_done(IpAddr::from([127, 0, 0, 1]), port, &QUICK)
            .await
            .expect("done sent");
        assert_eq!(got.await.expect("listener task"), b"done");

        // A port nobody listens on: every attempt is refused, and the error says so.
        let closed = {
            let l = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
            l.local_addr().expect("addr").port()
        };
        let started = std::time::Instant::now();
        let err = notify_done(IpAddr::from([127, 0, 0, 1]), closed, &QUICK)
            .await
            .expect_err("nobody listens");
        let text = format!("{err:#}");
        assert!(text.contains(&format!("127.0.0.1:{closed}")), "{text}");
        assert!(text.contains("after 3 attempts"), "{text}");
        assert!(text.contains("connection refused"), "{text}");
        // Two waits between three tries, no more.
        assert!(started.elapsed() >= 2 * QUICK.retry_interval, "{text}");
        assert!(started.elapsed() < Duration::from_secs(2), "{text}");
    }

    #[tokio::test]
    async fn a_late_listener_gets_done_on_a_later_try() {
        let port = {
            let l = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
            l.local_addr().expect("addr").port()
        };
        // The ramdisk starts listening after the first try was refused.
        let late = tokio::spawn(async move {
            tokio::time::sleep(Duration::from_millis(100)).await;
            let listener = tokio::net::TcpListener::bind(("127.0.0.1", port))
                .await
                .expect("bind the late listener");
            let (mut stream, _) = listener.accept().await.expect("accept");
            let mut buf = Vec::new();
            tokio::io::AsyncReadExt::read_to_end(&mut stream, &mut buf)
                .await
                .expect("read");
            buf
        });
        let policy = DonePolicy {
            attempts: 20,
            retry_interval: Duration::from_millis(50),
            ..QUICK
        };
        notify_done(IpAddr::from([127, 0, 0, 1]), port, &policy)
            .await
            .expect("done sent on a later try");
        assert_eq!(late.await.expect("listener task"), b"done");
    }
}
