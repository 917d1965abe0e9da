//! Which protocol to speak to a BMC, found by asking it, never by its model string
//! (docs/ilo-quirks.md §0).
//!
//! # Design
//! Two unauthenticated reads, made at once: `GET /xmldata?item=all` (every iLO: the generation
//! in `MP/PN`, the firmware in `MP/FWRI`, the model in `HSI/SPN`) and `GET /redfish/v1/` (any
//! Redfish service). Then [`choose`]:
//! - an iLO 4 or older is driven over RIBCL, even when its firmware (Gen9, 2.30 and later)
//!   answers Redfish: that Redfish changes virtual media only by PATCH and has no boot mode;
//! - anything else with a Redfish service root over Redfish (iLO 5, iLO 6 with RIBCL disabled,
//!   iLO 7 without RIBCL, another vendor's BMC);
//! - a BMC with neither answer over RIBCL, the older interface.
//!
//! `Managers/1 Oem.Hpe.RIBCLEnabled` does not enter the choice: RIBCL is chosen only for an
//! iLO 4 or a BMC without Redfish, where the switch does not exist. The readiness probe reports
//! it.
//!
//! A model string does not decide: proliantutils routes "Gen10" to Redfish and everything else
//! to RIBCL, so a Gen11 (iLO 6, RIBCL off) was driven over RIBCL and failed.

use std::time::{Duration, SystemTime};

use serde_json::Value;

use super::http::{build_client, map_reqwest_error, read_body};
use super::{IloConfig, Protocol};
use crate::drivers::DriverError;

/// What the unauthenticated endpoints said.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Detected {
    /// iLO generation from `xmldata` `MP/PN` ("Integrated Lights-Out 5 (iLO 5)" → 5).
    pub generation: Option<u32>,
    /// `MP/FWRI`, e.g. "2.72".
    pub firmware: Option<String>,
    /// `HSI/SPN`, e.g. "ProLiant DL380 Gen11".
    pub model: Option<String>,
    /// Whether `/redfish/v1/` answered with a JSON service root.
    pub redfish: bool,
    /// The service root's `RedfishVersion`, when it answered.
    pub redfish_version: Option<String>,
    /// The BMC's `Date` header and the conductor's clock when it arrived (the probe's clock
    /// check; temp URLs depend on agreeing clocks).
    pub clock: Option<ClockReading>,
}

/// A BMC's clock read from an HTTP `Date` header.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ClockReading {
    /// What the BMC said.
    pub bmc: SystemTime,
    /// The conductor's clock when the answer arrived.
    pub local: SystemTime,
}

/// The protocol for what was detected (see the module's Design).
pub fn choose(detected: &Detected) -> Protocol {
    match (detected.generation, detected.redfish) {
        (Some(generation), _) if generation <= 4 => Protocol::Ribcl,
        (_, true) => Protocol::Redfish,
        (_, false) => Protocol::Ribcl,
    }
}

/// The text of the first `<name>…</name>` element, trimmed; `None` when absent or empty.
fn element_text<'a>(xml: &'a str, name: &str) -> Option<&'a str> {
    let open = format!("<{name}>");
    let close = format!("</{name}>");
    let start = xml.find(&open)? + open.len();
    let end = xml[start..].find(&close)? + start;
    let text = xml[start..end].trim();
    (!text.is_empty()).then_some(text)
}

/// The generation in an `MP/PN` such as "Integrated Lights-Out 4 (iLO 4)".
fn generation_of(product_name: &str) -> Option<u32> {
    let after = &product_name[product_name.find("iLO")? + 3..];
    let digits: String = after
        .trim_start()
        .chars()
        .take_while(char::is_ascii_digit)
        .collect();
    digits.parse().ok()
}

/// Reads an `xmldata?item=all` document (untrusted: any bytes give an answer, never a panic).
pub fn parse_xmldata(body: &[u8]) -> Detected {
    let text = String::from_utf8_lossy(body);
    let mp = element_text(&text, "MP").unwrap_or("");
    let hsi = element_text(&text, "HSI").unwrap_or("");
    Detected {
        generation: element_text(mp, "PN").and_then(generation_of),
        firmware: element_text(mp, "FWRI").map(str::to_string),
        model: element_text(hsi, "SPN").map(str::to_string),
        ..Detected::default()
    }
}

/// What one unauthenticated GET brought: the body of a 2xx answer (`None` for any other
/// status) and the clock reading of its `Date` header.
struct Fetched {
    body: Option<bytes::Bytes>,
    clock: Option<ClockReading>,
}

/// One unauthenticated GET; the error when nothing answered.
async fn fetch(
    http: &reqwest::Client,
    url: &str,
    timeout: Duration,
) -> Result<Fetched, DriverError> {
    let response = http
        .get(url)
        .send()
        .await
        .map_err(|e| map_reqwest_error(url, timeout, &e))?;
    let local = SystemTime::now();
    let clock = response
        .headers()
        .get(reqwest::header::DATE)
        .and_then(|d| d.to_str().ok())
        .and_then(|d| httpdate::parse_http_date(d).ok())
        .map(|bmc| ClockReading { bmc, local });
    if !response.status().is_success() {
        return Ok(Fetched { body: None, clock });
    }
    let body = read_body(url, timeout, response).await?;
    Ok(Fetched {
        body: Some(body),
        clock,
    })
}

/// Asks the BMC of `config` what it is.
pub async fn detect(config: &IloConfig) -> Result<Detected, DriverError> {
    let base = config.base_url()?;
    let http = build_client(&config.tls, config.timeout)?;
    let xmldata_url = format!("{base}/xmldata?item=all");
    let root_url = format!("{base}/redfish/v1/");
    let (xmldata, root) = tokio::join!(
        fetch(&http, &xmldata_url, config.timeout),
        fetch(&http, &root_url, config.timeout)
    );
    // Nothing answered at all: the BMC is unreachable or its certificate is refused; say so.
    let (xmldata, root) = match (xmldata, root) {
        (Err(e), Err(_)) => return Err(e),
        (x, r) => (x.ok(), r.ok()),
    };
    let clock = xmldata
        .as_ref()
        .and_then(|x| x.clock)
        .or_else(|| root.as_ref().and_then(|r| r.clock));
    let xmldata = xmldata.and_then(|x| x.body);
    let root = root.and_then(|r| r.body);
    let mut detected = xmldata.as_deref().map(parse_xmldata).unwrap_or_default();
    detected.clock = clock;
    if let Some(root) = root {
        if let Ok(json) = serde_json::from_slice::<Value>(&root) {
            detected.redfish = json.is_object();
            detected.redfish_version = json
                .get("RedfishVersion")
                .and_then(Value::as_str)
                .map(str::to_string);
        }
    }
    tracing::debug!(?detected, protocol = %choose(&detected), "BMC detected");
    Ok(detected)
}

#[cfg(test)]
mod tests {
    use super::*;

    const ILO5: &str = "<?xml version=\"1.0\"?>\r\n<RIMP>\n<HSI>\n<SBSN>MXQ1</SBSN>\n<SPN>ProLiant DL385 Gen10 Plus v2</SPN>\n</HSI>\n<MP>\n<ST>1</ST>\n<PN>Integrated Lights-Out 5 (iLO 5)</PN>\n<FWRI>2.72</FWRI>\n</MP>\n</RIMP>\n";

    #[test]
    fn xmldata_names_generation_firmware_and_model() {
        let d = parse_xmldata(ILO5.as_bytes());
        assert_eq!(d.generation, Some(5));
        assert_eq!(d.firmware.as_deref(), Some("2.72"));
        assert_eq!(d.model.as_deref(), Some("ProLiant DL385 Gen10 Plus v2"));
        assert_eq!(generation_of("Integrated Lights-Out 4 (iLO 4)"), Some(4));
        assert_eq!(generation_of("Integrated Lights-Out 6 (iLO 6)"), Some(6));
        assert_eq!(generation_of("Integrated Lights-Out"), None);
    }

    #[test]
    fn the_generation_decides_not_the_model() {
        let with = |generation, redfish| Detected {
            generation,
            redfish,
            model: Some("ProLiant DL360 Gen10".into()),
            ..Detected::default()
        };
        // An iLO 4 with a Gen10-like name and a partial Redfish: RIBCL.
        assert_eq!(choose(&with(Some(4), true)), Protocol::Ribcl);
        assert_eq!(choose(&with(Some(5), true)), Protocol::Redfish);
        assert_eq!(choose(&with(Some(6), true)), Protocol::Redfish);
        // Not an iLO (no xmldata) but Redfish: Redfish; neither: RIBCL.
        assert_eq!(choose(&with(None, true)), Protocol::Redfish);
        assert_eq!(choose(&with(None, false)), Protocol::Ribcl);
    }

    proptest::proptest! {
        #[test]
        fn any_document_reads_without_panic(body in proptest::collection::vec(proptest::num::u8::ANY, 0..512)) {
            let d = parse_xmldata(&body);
            proptest::prop_assert!(!d.redfish);
            let _ = choose(&d);
        }

        #[test]
        fn the_generation_is_the_number_after_ilo(generation in 1u32..100, noise in "[ -~]{0,40}") {
            let pn = format!("Integrated Lights-Out {generation} (iLO {generation}){noise}");
            let doc = format!("<RIMP><MP><PN>{pn}</PN><FWRI>2.72</FWRI></MP></RIMP>");
            let d = parse_xmldata(doc.as_bytes());
            // Whatever follows the number (even a stray "</PN>") cannot change it.
            proptest::prop_assert_eq!(d.generation, Some(generation));
        }
    }

    #[test]
    fn any_bytes_give_an_answer() {
        for body in [
            &b""[..],
            b"<MP><PN>",
            b"<MP></MP>",
            b"<MP><PN>iLO</PN></MP>",
            b"\xff\xfe<PN>iLO 99999999999999999999</PN>",
            b"<HSI><SPN></SPN></HSI>",
        ] {
            let d = parse_xmldata(body);
            assert!(!d.redfish);
        }
    }
}
