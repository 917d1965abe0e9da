//! RIBCL transport: one command per HTTPS `POST /ribcl`, credentials in every request, the
//! reply parsed and its statuses checked (docs/ilo-management.md §1.1-§1.3).

use std::time::Duration;

use super::codec::{parse_reply, RibclCommand, RibclReply};
use super::error::classify_status;
use crate::drivers::ilo::http::{
    build_client, map_reqwest_error, read_body, with_retries, RetryPolicy,
};
use crate::drivers::ilo::IloConfig;
use crate::drivers::{DriverError, Secret};

/// A RIBCL client for one iLO.
#[derive(Debug, Clone)]
pub struct RibclClient {
    http: reqwest::Client,
    url: String,
    username: String,
    password: Secret,
    timeout: Duration,
    retry: RetryPolicy,
}

impl RibclClient {
    /// A client for the iLO in `config`; nothing is sent yet.
    pub fn new(config: &IloConfig) -> Result<Self, DriverError> {
        Ok(Self {
            http: build_client(&config.tls, config.timeout)?,
            url: format!("{}/ribcl", config.base_url()?),
            username: config.username.clone(),
            password: config.password.clone(),
            timeout: config.timeout,
            retry: config.retry,
        })
    }

    /// The URL commands are posted to.
    pub fn url(&self) -> &str {
        &self.url
    }

    /// Sends one command and returns its reply once every RESPONSE is `0x0000`; an error status
    /// becomes the matching [`DriverError`]. Transient failures are retried within the timeout.
    pub async fn execute(&self, command: &RibclCommand) -> Result<RibclReply, DriverError> {
        // The body holds the password: it is built here and never logged.
        let body = command.encode(&self.username, self.password.expose());
        tracing::debug!(url = %self.url, command = command.name(), "RIBCL request");
        let reply = with_retries(&self.url, self.timeout, self.retry, || {
            self.attempt(body.clone(), command.name())
        })
        .await?;
        let informational = reply.informational();
        if !informational.is_empty() {
            tracing::debug!(command = command.name(), messages = ?informational, "iLO says");
        }
        Ok(reply)
    }

    async fn attempt(&self, body: String, command: &str) -> Result<RibclReply, DriverError> {
        let response = self
            .http
            .post(&self.url)
            .header(reqwest::header::CONTENT_TYPE, "text/xml")
            .body(body)
            .send()
            .await
            .map_err(|e| map_reqwest_error(&self.url, self.timeout, &e))?;
        let status = response.status();
        // reqwest undoes chunked transfer encoding (what real iLOs send, docs/ilo-management.md §1.2) and
        // reads Content-Length bodies alike.
        let bytes = read_body(&self.url, self.timeout, response).await?;
        if !status.is_success() {
            return Err(DriverError::HttpStatus {
                status: status.as_u16(),
                request: format!("RIBCL POST {}", self.url),
                message: status.canonical_reason().unwrap_or("error").to_string(),
            });
        }
        let reply = parse_reply(&bytes).map_err(|e| DriverError::MalformedReply {
            url: self.url.clone(),
            message: format!("{command}: {e}"),
        })?;
        if let Some(error) = reply.first_error() {
            return Err(classify_status(error.status, &error.message, command));
        }
        Ok(reply)
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicU32, Ordering};
    use std::sync::Arc;

    use super::*;
    use crate::drivers::ilo::ribcl::codec::samples::{reply_error, reply_with};
    use crate::drivers::ilo::test_server::{Reply, TestServer};
    use crate::drivers::ilo::{Protocol, TlsVerify};
    use crate::drivers::{Management, Power, PowerState, VirtualMedia, VmediaDevice};

    fn config(server: &TestServer, timeout: Duration) -> IloConfig {
        let mut c = IloConfig::new(server.address.clone(), "admin", Secret::new("pa<ss"));
        c.tls = TlsVerify::CaFile(server.cert_path.clone());
        c.timeout = timeout;
        c.protocol = Protocol::Ribcl;
        c.retry = RetryPolicy::new(3, Duration::from_millis(20));
        c
    }

    fn power_on_reply() -> String {
        reply_with("<GET_HOST_POWER HOST_POWER=\"ON\"/>")
    }

    #[tokio::test]
    async fn chunked_and_plain_replies_work_with_ca_verification() {
        let server = TestServer::start(|req| {
            if req.body.contains("GET_HOST_POWER_STATUS") {
                Reply::Chunked {
                    body: power_on_reply(),
                    chunk: 7,
                }
            } else {
                Reply::ok(reply_with(
                    "<GET_VM_STATUS VM_APPLET=\"DISCONNECTED\" DEVICE=\"CDROM\" BOOT_OPTION=\"NO_BOOT\" WRITE_PROTECT=\"NO\" IMAGE_INSERTED=\"NO\" IMAGE_URL=\"\"/>",
                ))
            }
        })
        .await;
        let client = RibclClient::new(&config(&server, Duration::from_secs(10))).expect("client");
        assert_eq!(client.power_state().await.expect("power"), PowerState::On);
        let vm = client
            .vmedia_status(VmediaDevice::Cdrom)
            .await
            .expect("vm status");
        assert!(!vm.inserted);
        let requests = server.requests();
        assert_eq!(requests.len(), 2);
        assert_eq!(requests[0].method, "POST");
        assert_eq!(requests[0].path, "/ribcl");
        assert!(requests[0].body.starts_with("<RIBCL VERSION=\"2.0\"><LOGIN USER_LOGIN=\"admin\" PASSWORD=\"pa&lt;ss\"><SERVER_INFO MODE=\"read\"><GET_HOST_POWER_STATUS />"));
        assert!(requests[1]
            .body
            .contains("<RIB_INFO MODE=\"read\"><GET_VM_STATUS DEVICE=\"CDROM\" />"));
        assert!(requests[0].body.ends_with("\r\n"));
    }

    #[tokio::test]
    async fn untrusted_certificate_is_refused_by_default_and_accepted_when_insecure() {
        let server = TestServer::start(|_| Reply::ok(power_on_reply())).await;
        let mut c = config(&server, Duration::from_secs(5));
        c.tls = TlsVerify::System;
        let err = RibclClient::new(&c)
            .expect("client")
            .power_state()
            .await
            .expect_err("self-signed certificate must not verify");
        assert!(matches!(err, DriverError::Tls { .. }), "{err}");
        assert!(
            server.requests().is_empty(),
            "no request may pass an unverified TLS session"
        );
        c.tls = TlsVerify::Insecure;
        assert_eq!(
            RibclClient::new(&c)
                .expect("client")
                .power_state()
                .await
                .expect("insecure works"),
            PowerState::On
        );
    }

    #[tokio::test]
    async fn login_failure_is_typed() {
        let server = TestServer::start(|_| Reply::ok(reply_error("0x005F", "Login failed."))).await;
        let client = RibclClient::new(&config(&server, Duration::from_secs(5))).expect("client");
        let err = client.power_state().await.expect_err("login fails");
        assert!(matches!(err, DriverError::LoginFailed { .. }), "{err}");
        assert_eq!(err.to_string(), "login failed: Login failed.");
        assert_eq!(server.requests().len(), 1, "a failed login is not retried");
    }

    #[tokio::test]
    async fn unsupported_command_is_typed() {
        let server = TestServer::start(|_| {
            Reply::ok(reply_error(
                "0x003C",
                "Feature not supported - GET_PENDING_BOOT_MODE",
            ))
        })
        .await;
        let client = RibclClient::new(&config(&server, Duration::from_secs(5))).expect("client");
        let err = client.pending_boot_mode().await.expect_err("unsupported");
        match err {
            DriverError::NotSupported { operation, message } => {
                assert_eq!(operation, "GET_PENDING_BOOT_MODE");
                assert!(message.contains("Feature not supported"));
            }
            other => panic!("wrong error {other}"),
        }
    }

    #[tokio::test]
    async fn silent_ilo_times_out_within_client_timeout() {
        let server = TestServer::start(|_| Reply::Hang).await;
        let client =
            RibclClient::new(&config(&server, Duration::from_millis(700))).expect("client");
        let start = std::time::Instant::now();
        let err = client.power_state().await.expect_err("times out");
        let elapsed = start.elapsed();
        assert!(matches!(err, DriverError::Timeout { .. }), "{err}");
        assert!(elapsed < Duration::from_millis(1500), "took {elapsed:?}");
        assert!(err.to_string().contains("within 0.7 s"), "{err}");
    }

    #[tokio::test]
    async fn http_500_is_retried_then_reported() {
        let calls = Arc::new(AtomicU32::new(0));
        let seen = calls.clone();
        let server = TestServer::start(move |_| {
            if seen.fetch_add(1, Ordering::SeqCst) == 0 {
                Reply::status(500, "oops")
            } else {
                Reply::ok(power_on_reply())
            }
        })
        .await;
        let client = RibclClient::new(&config(&server, Duration::from_secs(5))).expect("client");
        assert_eq!(client.power_state().await.expect("retried"), PowerState::On);
        assert_eq!(calls.load(Ordering::SeqCst), 2);

        let always = TestServer::start(|_| Reply::status(500, "oops")).await;
        let client = RibclClient::new(&config(&always, Duration::from_secs(5))).expect("client");
        let err = client.power_state().await.expect_err("stays 500");
        assert!(
            matches!(err, DriverError::HttpStatus { status: 500, .. }),
            "{err}"
        );
        assert_eq!(always.requests().len(), 3, "three attempts in all");
    }

    #[tokio::test]
    async fn busy_ilo_is_retried() {
        let calls = Arc::new(AtomicU32::new(0));
        let seen = calls.clone();
        let server = TestServer::start(move |_| {
            if seen.fetch_add(1, Ordering::SeqCst) < 2 {
                Reply::ok(reply_error("0x0088", "iLO is busy, try again later."))
            } else {
                Reply::ok(power_on_reply())
            }
        })
        .await;
        let client = RibclClient::new(&config(&server, Duration::from_secs(5))).expect("client");
        assert_eq!(client.power_state().await.expect("retried"), PowerState::On);
        assert_eq!(calls.load(Ordering::SeqCst), 3);
    }

    #[tokio::test]
    async fn bad_bodies_are_typed_errors() {
        let cases: Vec<(Reply, &str)> = vec![
            (Reply::ok("Internal failure, no XML here"), "is not XML"),
            (
                Reply::ok("<?xml version=\"1.0\"?><html><body>login</body></html>"),
                "is not XML",
            ),
            (
                Reply::ok("<?xml version=\"1.0\"?><LOGIN_PAGE/>"),
                "<LOGIN_PAGE> document where <RIBCL> was expected",
            ),
            (Reply::ok(power_on_reply()[..150].to_string()), "truncated"),
            (
                Reply::ShortBody {
                    declared: 4000,
                    body: power_on_reply()[..150].to_string(),
                },
                "reply truncated",
            ),
            (Reply::ok(""), "empty reply body"),
            (
                Reply::Chunked {
                    body: "<".repeat(crate::drivers::ilo::http::MAX_REPLY_BYTES + 1),
                    chunk: 1 << 20,
                },
                "reply larger than",
            ),
        ];
        for (reply, want) in cases {
            let reply2 = reply.clone();
            let server = TestServer::start(move |_| reply2.clone()).await;
            let client =
                RibclClient::new(&config(&server, Duration::from_secs(5))).expect("client");
            let err = client.power_state().await.expect_err("bad body");
            assert!(
                matches!(err, DriverError::MalformedReply { .. }),
                "{reply:?}: {err}"
            );
            assert!(err.to_string().contains(want), "{reply:?}: {err}");
        }
    }

    #[tokio::test]
    async fn refused_connection_is_a_connection_error() {
        let port = {
            let l = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
            l.local_addr().expect("addr").port()
        };
        let mut c = IloConfig::new(format!("127.0.0.1:{port}"), "u", Secret::new("p"));
        c.timeout = Duration::from_secs(3);
        c.retry = RetryPolicy::new(2, Duration::from_millis(10));
        let err = RibclClient::new(&c)
            .expect("client")
            .power_state()
            .await
            .expect_err("nothing listens");
        assert!(matches!(err, DriverError::Connection { .. }), "{err}");
    }

    #[tokio::test]
    async fn debug_output_masks_the_password() {
        let server = TestServer::start(|_| Reply::ok(power_on_reply())).await;
        let client = RibclClient::new(&config(&server, Duration::from_secs(5))).expect("client");
        let debug = format!("{client:?}");
        assert!(!debug.contains("pa<ss"), "{debug}");
        assert!(debug.contains("******"));
    }
}
