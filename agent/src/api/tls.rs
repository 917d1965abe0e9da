//! The command API's auto-TLS (Ironic's `agent_verify_ca`, docs/ironic-protocols.md
//! §3.2; docs/architecture.md §7): a self-signed certificate generated at boot for the address the conductor
//! reaches the agent at, sent in every heartbeat and pinned by the conductor.
//!
//! # Design
//! ECDSA P-256 with ring (rcgen), a fresh key pair on every boot, never written anywhere: the
//! certificate is only good for as long as this ramdisk runs. The subject alternative name is the
//! advertised IP address (the host of `callback_url`), so a client that checks the name, as
//! reqwest/rustls do, accepts it. The certificate is not a CA (webpki refuses a CA certificate
//! as a server's own) and says `serverAuth`.
//!
//! # Limitations
//! The validity period is rcgen's default (1975 to 4096): the ramdisk's clock may be anything
//! before NTP, and a pinned, boot-lived certificate gains nothing from a short period.

use std::net::IpAddr;
use std::sync::Arc;

use anyhow::Context;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer};

/// The agent's certificate: the PEM for heartbeats and the server side of the handshake.
#[derive(Clone)]
pub struct AgentCert {
    /// The certificate, PEM (`agent_verify_ca`).
    pub cert_pem: String,
    /// The TLS server configuration presenting it.
    pub server_config: Arc<rustls::ServerConfig>,
}

impl std::fmt::Debug for AgentCert {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // The private key stays out of logs; the certificate is public.
        f.debug_struct("AgentCert")
            .field("cert_pem", &self.cert_pem)
            .finish_non_exhaustive()
    }
}

/// Generates a self-signed certificate for `address` and the server configuration for it.
pub fn generate(address: IpAddr) -> anyhow::Result<AgentCert> {
    // Fails only when a provider is already installed, which is what we want anyway.
    let _ = rustls::crypto::ring::default_provider().install_default();
    let mut params =
        rcgen::CertificateParams::new(Vec::<String>::new()).context("certificate parameters")?;
    params
        .distinguished_name
        .push(rcgen::DnType::CommonName, address.to_string());
    params
        .subject_alt_names
        .push(rcgen::SanType::IpAddress(address));
    params.is_ca = rcgen::IsCa::ExplicitNoCa;
    params.key_usages = vec![rcgen::KeyUsagePurpose::DigitalSignature];
    params.extended_key_usages = vec![rcgen::ExtendedKeyUsagePurpose::ServerAuth];
    let key = rcgen::KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256)
        .context("generating the command API's key pair")?;
    let cert = params
        .self_signed(&key)
        .context("self-signing the command API's certificate")?;
    let server_config = rustls::ServerConfig::builder()
        .with_no_client_auth()
        .with_single_cert(
            vec![CertificateDer::from(cert.der().to_vec())],
            PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(key.serialize_der())),
        )
        .context("setting up the command API's TLS")?;
    Ok(AgentCert {
        cert_pem: cert.pem(),
        server_config: Arc::new(server_config),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use rustls::pki_types::pem::PemObject;

    #[test]
    fn certificate_is_pem_for_the_address() {
        let addr: IpAddr = "192.0.2.7".parse().expect("ip");
        let cert = generate(addr).expect("certificate");
        assert!(cert.cert_pem.starts_with("-----BEGIN CERTIFICATE-----"));
        let der = CertificateDer::from_pem_slice(cert.cert_pem.as_bytes()).expect("one PEM cert");
        // The IP SAN is the 4 address bytes under the iPAddress tag [7] (0x87, length 4).
        assert!(
            der.windows(6).any(|w| w == [0x87, 4, 192, 0, 2, 7]),
            "IP SAN for {addr}"
        );
        let other = generate(addr).expect("second certificate");
        assert_ne!(other.cert_pem, cert.cert_pem, "a fresh key every boot");
        assert!(!format!("{cert:?}").contains("PRIVATE"));
    }
}
