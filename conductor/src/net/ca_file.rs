//! Server certificates checked against an operator's CA file, as OpenSSL-based clients check
//! them: a self-signed certificate given as its own CA is accepted even when it is marked
//! `CA:TRUE`.
//!
//! # Why
//! Operators pin an iLO by handing its own self-signed certificate over as `ilo_verify_ca` or
//! `redfish_verify_ca`. `openssl req -x509` marks such a certificate `CA:TRUE` by default, and
//! Ironic (Python, OpenSSL) accepts it. webpki does not: a certificate with `CA:TRUE` may not end
//! a chain, so the handshake fails with `CaUsedAsEndEntity` and the operator's pin looks broken.
//!
//! # Rule
//! [`CaFileVerifier`] runs webpki's full check against the CA file first. Only when that fails
//! with `CaUsedAsEndEntity`, the presented certificate is accepted if it is byte for byte one of
//! the CA file's certificates and is valid for the name dialled. Nothing else changes: any other
//! certificate, an expired one (webpki checks validity before the CA flag), a wrong name or a
//! chain the file does not vouch for are refused as before. The TLS signatures are webpki's.

use std::sync::Arc;

use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::client::{verify_server_name, WebPkiServerVerifier};
use rustls::pki_types::{CertificateDer, ServerName, UnixTime};
use rustls::server::ParsedCertificate;
use rustls::{CertificateError, DigitallySignedStruct, Error, RootCertStore, SignatureScheme};

/// See the module's documentation.
#[derive(Debug)]
pub struct CaFileVerifier {
    inner: Arc<WebPkiServerVerifier>,
    pinned: Vec<CertificateDer<'static>>,
}

impl CaFileVerifier {
    /// A verifier trusting the certificates `ca` (DER) as anchors.
    pub fn new(ca: Vec<CertificateDer<'static>>) -> Result<CaFileVerifier, Error> {
        let mut roots = RootCertStore::empty();
        for cert in &ca {
            roots
                .add(cert.clone())
                .map_err(|e| Error::General(format!("a CA certificate is unusable: {e}")))?;
        }
        let inner = WebPkiServerVerifier::builder(Arc::new(roots))
            .build()
            .map_err(|e| Error::General(format!("building the certificate verifier: {e}")))?;
        Ok(CaFileVerifier { inner, pinned: ca })
    }
}

/// Whether rustls refused the certificate because it is a CA used as an end entity.
fn is_ca_used_as_end_entity(error: &Error) -> bool {
    match error {
        Error::InvalidCertificate(CertificateError::Other(other)) => other
            .0
            .downcast_ref::<webpki::Error>()
            .is_some_and(|e| matches!(e, webpki::Error::CaUsedAsEndEntity)),
        _ => false,
    }
}

impl ServerCertVerifier for CaFileVerifier {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        server_name: &ServerName<'_>,
        ocsp_response: &[u8],
        now: UnixTime,
    ) -> Result<ServerCertVerified, Error> {
        match self.inner.verify_server_cert(
            end_entity,
            intermediates,
            server_name,
            ocsp_response,
            now,
        ) {
            Err(error)
                if is_ca_used_as_end_entity(&error)
                    && self
                        .pinned
                        .iter()
                        .any(|pin| pin.as_ref() == end_entity.as_ref()) =>
            {
                let parsed = ParsedCertificate::try_from(end_entity)?;
                verify_server_name(&parsed, server_name)?;
                tracing::debug!(%error, "accepting the pinned self-signed CA certificate");
                Ok(ServerCertVerified::assertion())
            }
            other => other,
        }
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, Error> {
        self.inner.verify_tls12_signature(message, cert, dss)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, Error> {
        self.inner.verify_tls13_signature(message, cert, dss)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.inner.supported_verify_schemes()
    }
}

/// A rustls client configuration checking servers with [`CaFileVerifier`] over `ca`.
pub fn client_config(ca: Vec<CertificateDer<'static>>) -> Result<rustls::ClientConfig, Error> {
    let verifier = CaFileVerifier::new(ca)?;
    Ok(rustls::ClientConfig::builder()
        .dangerous()
        .with_custom_certificate_verifier(Arc::new(verifier))
        .with_no_client_auth())
}
