//! The operator's load balancer in front of several conductors' APIs, for tests: one loopback
//! address the ramdisks and clients call, each connection passed to the next backend that
//! accepts it (round robin, skipping a dead one). It stands in for the HAProxy or virtual IP
//! an operator puts in front of the conductors, which the conductors themselves do not provide.
//!
//! Plain TCP: bytes are copied both ways, TLS (if any) is end to end.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::net::{TcpListener, TcpStream};

/// How long a backend may take to accept before the next one is tried.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(2);

/// A running front door; it stops when dropped.
pub struct FrontDoor {
    addr: SocketAddr,
    backends: Arc<Mutex<Vec<SocketAddr>>>,
    refused: Arc<AtomicUsize>,
    task: tokio::task::JoinHandle<()>,
}

impl FrontDoor {
    /// Listens on a free loopback port and passes connections to `backends`.
    pub async fn start(backends: Vec<SocketAddr>) -> std::io::Result<FrontDoor> {
        let listener = TcpListener::bind("127.0.0.1:0").await?;
        let addr = listener.local_addr()?;
        let backends = Arc::new(Mutex::new(backends));
        let refused = Arc::new(AtomicUsize::new(0));
        let next = Arc::new(AtomicUsize::new(0));
        let task = {
            let (backends, refused) = (backends.clone(), refused.clone());
            tokio::spawn(async move {
                while let Ok((client, _)) = listener.accept().await {
                    let (backends, refused, next) =
                        (backends.clone(), refused.clone(), next.clone());
                    tokio::spawn(async move {
                        let list = backends.lock().map(|b| b.clone()).unwrap_or_default();
                        let start = next.fetch_add(1, Ordering::Relaxed);
                        for i in 0..list.len() {
                            let backend = list[(start + i) % list.len()];
                            let connect = TcpStream::connect(backend);
                            if let Ok(Ok(mut upstream)) =
                                tokio::time::timeout(CONNECT_TIMEOUT, connect).await
                            {
                                let mut client = client;
                                let _ =
                                    tokio::io::copy_bidirectional(&mut client, &mut upstream).await;
                                return;
                            }
                        }
                        // No backend took it: the client sees the connection closed.
                        refused.fetch_add(1, Ordering::Relaxed);
                    });
                }
            })
        };
        Ok(FrontDoor {
            addr,
            backends,
            refused,
            task,
        })
    }

    /// `http://127.0.0.1:<port>`.
    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// Replaces the backends (a conductor started again on a new port).
    pub fn set_backends(&self, backends: Vec<SocketAddr>) {
        if let Ok(mut list) = self.backends.lock() {
            *list = backends;
        }
    }

    /// Connections no backend accepted.
    pub fn refused(&self) -> usize {
        self.refused.load(Ordering::Relaxed)
    }
}

impl Drop for FrontDoor {
    fn drop(&mut self) {
        self.task.abort();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    async fn echo(tag: u8) -> (SocketAddr, tokio::task::JoinHandle<()>) {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let addr = listener.local_addr().expect("addr");
        let task = tokio::spawn(async move {
            while let Ok((mut s, _)) = listener.accept().await {
                tokio::spawn(async move {
                    let mut b = [0u8; 1];
                    if s.read_exact(&mut b).await.is_ok() {
                        let _ = s.write_all(&[b[0], tag]).await;
                    }
                });
            }
        });
        (addr, task)
    }

    async fn call(door: &FrontDoor) -> Option<u8> {
        let mut s = TcpStream::connect(door.addr).await.ok()?;
        s.write_all(&[7]).await.ok()?;
        let mut b = [0u8; 2];
        s.read_exact(&mut b).await.ok()?;
        assert_eq!(b[0], 7, "the bytes went through unchanged");
        Some(b[1])
    }

    #[tokio::test]
    async fn connections_go_round_robin_and_skip_a_dead_backend() {
        let (a, _ta) = echo(1).await;
        let (b, tb) = echo(2).await;
        let door = FrontDoor::start(vec![a, b]).await.expect("start");
        let mut seen = Vec::new();
        for _ in 0..4 {
            seen.push(call(&door).await.expect("answered"));
        }
        seen.sort();
        assert_eq!(seen, [1, 1, 2, 2]);
        tb.abort();
        let _ = tb.await;
        for _ in 0..4 {
            assert_eq!(call(&door).await, Some(1), "b is gone: a answers");
        }
        door.set_backends(vec![b]);
        assert_eq!(call(&door).await, None, "no live backend");
        tokio::time::sleep(Duration::from_millis(50)).await;
        assert_eq!(door.refused(), 1);
    }
}
