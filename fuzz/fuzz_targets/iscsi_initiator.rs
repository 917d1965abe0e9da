//! The conductor's iSCSI initiator, reading what a target sends: `initiator::Session::open`
//! (login with its security and operational stages, then READ CAPACITY, retried on a unit
//! attention) against a loopback "target" that answers with the input whatever was asked, then
//! a read, a write and a logout on the session when the input lets it open. The session's
//! reader task (sequence numbers, NOP-In pings, Reject routing, Data-In assembly) runs on every
//! PDU the input holds.
#![no_main]

use std::io::{Read as _, Write as _};
use std::net::{Shutdown, TcpListener};
use std::sync::mpsc::{sync_channel, SyncSender};
use std::sync::{Mutex, OnceLock};
use std::time::Duration;

use libfuzzer_sys::fuzz_target;
use vmdeploy_conductor::initiator::session::Session;
use vmdeploy_conductor::initiator::{SessionConfig, Timeouts};

struct Fixture {
    runtime: tokio::runtime::Runtime,
    portal: String,
    replies: Mutex<SyncSender<Vec<u8>>>,
}

/// A thread that accepts one connection per input: writes the input, closes its sending side,
/// and reads until the initiator closes (so no unread request turns the close into a reset that
/// could discard replies the initiator has not read yet).
fn fixture() -> &'static Fixture {
    static FIXTURE: OnceLock<Fixture> = OnceLock::new();
    FIXTURE.get_or_init(|| {
        let listener = TcpListener::bind("127.0.0.1:0").expect("a loopback listener");
        let portal = listener.local_addr().expect("its address").to_string();
        let (tx, rx) = sync_channel::<Vec<u8>>(1);
        std::thread::spawn(move || {
            for stream in listener.incoming() {
                let Ok(mut stream) = stream else { continue };
                let reply = rx.recv().unwrap_or_default();
                std::thread::spawn(move || {
                    let _ = stream.write_all(&reply);
                    let _ = stream.shutdown(Shutdown::Write);
                    let mut sink = [0u8; 65536];
                    while matches!(stream.read(&mut sink), Ok(n) if n > 0) {}
                });
            }
        });
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("a tokio runtime");
        Fixture {
            runtime,
            portal,
            replies: Mutex::new(tx),
        }
    })
}

fuzz_target!(|data: &[u8]| {
    let f = fixture();
    f.replies
        .lock()
        .expect("reply channel")
        .send(data.to_vec())
        .expect("the fake target runs");
    let mut config = SessionConfig::new(f.portal.clone(), "iqn.2008-10.org.openstack:fuzz", 1);
    // Every reply is already there or never comes: short limits only bound a stuck session.
    let second = Duration::from_secs(1);
    config.timeouts = Timeouts {
        connect: second,
        login: second,
        command: second,
        write: second,
        logout: second,
    };
    f.runtime.block_on(async {
        let session = match Session::open(&config).await {
            Ok(s) => s,
            Err(e) => {
                assert!(!e.to_string().is_empty());
                return;
            }
        };
        let block = session.block_len();
        assert!(block > 0 && block % 512 == 0);
        let _ = session.read(0, 1).await;
        let _ = session.write(0, bytes::Bytes::from(vec![0u8; block])).await;
        let _ = session.logout().await;
    });
});
