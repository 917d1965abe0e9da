//! RIBCL wire format: the request document and the multi-document reply
//! (docs/ilo-management.md §1.1-§1.3).
//!
//! # Design
//! A request is one command inside `RIBCL/LOGIN/<wrapper MODE=..>`, one line, no XML
//! declaration, `\r\n` at the end, as proliantutils sends it.
//!
//! A reply is several XML documents back to back, one per stage, each a `<RIBCL>` root holding
//! a `<RESPONSE STATUS=.. MESSAGE=..>` and, in the command's document, the payload after it. The
//! parser streams the whole body with quick-xml, document after document, so an error status in
//! any stage is seen and every payload element is kept (proliantutils keeps only the last one).
//! Attribute names are matched case-insensitively: real iLOs answer `DEVICE value=` in one place
//! and `VALUE=` in another (docs/ilo-management.md §1.5 notes).
//!
//! # Limitations
//! Namespaces, DTDs and processing instructions are ignored (RIBCL uses none).

use quick_xml::events::{BytesStart, Event};
use quick_xml::Reader;

use super::error::RibclParseError;

/// An XML element: name, attributes in document order, children and text.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct XmlElement {
    /// Tag name as sent.
    pub name: String,
    /// Attributes as (name, unescaped value).
    pub attrs: Vec<(String, String)>,
    /// Child elements.
    pub children: Vec<XmlElement>,
    /// Concatenated text content (trimmed).
    pub text: String,
}

impl XmlElement {
    /// An element with no attributes or children.
    pub fn new(name: impl Into<String>) -> Self {
        Self {
            name: name.into(),
            ..Self::default()
        }
    }

    /// Adds an attribute (builder style).
    pub fn attr(mut self, name: impl Into<String>, value: impl Into<String>) -> Self {
        self.attrs.push((name.into(), value.into()));
        self
    }

    /// Adds a child (builder style).
    pub fn child(mut self, child: XmlElement) -> Self {
        self.children.push(child);
        self
    }

    /// An attribute's value, the name matched case-insensitively.
    pub fn get(&self, name: &str) -> Option<&str> {
        self.attrs
            .iter()
            .find(|(n, _)| n.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }

    /// The first child with this tag name (case-insensitive).
    pub fn find(&self, name: &str) -> Option<&XmlElement> {
        self.children
            .iter()
            .find(|c| c.name.eq_ignore_ascii_case(name))
    }

    /// All children with this tag name (case-insensitive).
    pub fn find_all<'a>(&'a self, name: &'a str) -> impl Iterator<Item = &'a XmlElement> + 'a {
        self.children
            .iter()
            .filter(move |c| c.name.eq_ignore_ascii_case(name))
    }

    /// The `VALUE` attribute of child `name`: RIBCL's usual `<X VALUE=".."/>` shape.
    pub fn child_value(&self, name: &str) -> Option<&str> {
        self.find(name).and_then(|c| c.get("VALUE"))
    }

    /// Serialises the element on one line, attribute values escaped.
    pub fn write_to(&self, out: &mut String) {
        out.push('<');
        out.push_str(&self.name);
        for (name, value) in &self.attrs {
            out.push(' ');
            out.push_str(name);
            out.push_str("=\"");
            out.push_str(&quick_xml::escape::escape(value.as_str()));
            out.push('"');
        }
        if self.children.is_empty() && self.text.is_empty() {
            out.push_str(" />");
            return;
        }
        out.push('>');
        out.push_str(&quick_xml::escape::escape(self.text.as_str()));
        for child in &self.children {
            child.write_to(out);
        }
        out.push_str("</");
        out.push_str(&self.name);
        out.push('>');
    }
}

/// The block a command must sit in; the wrong one is a syntax error to a real iLO (docs/ilo-management.md §1.1).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Wrapper {
    /// Host commands: power, boot, boot mode, product name, health.
    ServerInfo,
    /// iLO commands: virtual media, licences, firmware.
    RibInfo,
}

/// Read or write access to the wrapper block.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// Queries.
    Read,
    /// Changes.
    Write,
}

/// One RIBCL command with its wrapper.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RibclCommand {
    /// The wrapper block.
    pub wrapper: Wrapper,
    /// Its access mode.
    pub mode: Mode,
    /// The command element.
    pub command: XmlElement,
}

impl RibclCommand {
    /// A read command in the given wrapper.
    pub fn read(wrapper: Wrapper, command: XmlElement) -> Self {
        Self {
            wrapper,
            mode: Mode::Read,
            command,
        }
    }

    /// A write command in the given wrapper.
    pub fn write(wrapper: Wrapper, command: XmlElement) -> Self {
        Self {
            wrapper,
            mode: Mode::Write,
            command,
        }
    }

    /// The command's tag name, for messages.
    pub fn name(&self) -> &str {
        &self.command.name
    }

    /// The request body: `<RIBCL VERSION="2.0"><LOGIN ..><WRAPPER MODE=..>CMD</..></LOGIN></RIBCL>\r\n`.
    /// The password is in it: never log the result.
    pub fn encode(&self, username: &str, password: &str) -> String {
        let wrapper = match self.wrapper {
            Wrapper::ServerInfo => "SERVER_INFO",
            Wrapper::RibInfo => "RIB_INFO",
        };
        let mode = match self.mode {
            Mode::Read => "read",
            Mode::Write => "write",
        };
        let doc = XmlElement::new("RIBCL").attr("VERSION", "2.0").child(
            XmlElement::new("LOGIN")
                .attr("USER_LOGIN", username)
                .attr("PASSWORD", password)
                .child(
                    XmlElement::new(wrapper)
                        .attr("MODE", mode)
                        .child(self.command.clone()),
                ),
        );
        let mut out = String::with_capacity(256);
        doc.write_to(&mut out);
        out.push_str("\r\n");
        out
    }
}

/// One `<RESPONSE STATUS=.. MESSAGE=..>`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RibclResponse {
    /// STATUS, parsed as hex.
    pub status: u32,
    /// MESSAGE.
    pub message: String,
}

/// A whole reply: every RESPONSE of every document, and every payload element.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct RibclReply {
    /// Documents seen.
    pub documents: usize,
    /// RESPONSE elements in order.
    pub responses: Vec<RibclResponse>,
    /// Children of the RIBCL roots other than RESPONSE, in order.
    pub payload: Vec<XmlElement>,
}

impl RibclReply {
    /// The first non-zero RESPONSE, if any.
    pub fn first_error(&self) -> Option<&RibclResponse> {
        self.responses.iter().find(|r| r.status != 0)
    }

    /// Messages of successful stages other than `No error` (`Server being reset.`,
    /// `Host power is already ON.`): informational, kept for the caller.
    pub fn informational(&self) -> Vec<String> {
        self.responses
            .iter()
            .filter(|r| r.status == 0 && !r.message.trim().eq_ignore_ascii_case("no error"))
            .map(|r| r.message.trim().to_string())
            .collect()
    }

    /// The first payload element with this name (case-insensitive).
    pub fn payload(&self, name: &str) -> Option<&XmlElement> {
        self.payload
            .iter()
            .find(|e| e.name.eq_ignore_ascii_case(name))
    }
}

/// Parses a STATUS attribute: `0x005F`, `0x005f` or plain hex.
fn parse_status(raw: &str) -> Result<u32, RibclParseError> {
    let t = raw.trim();
    let digits = t
        .strip_prefix("0x")
        .or_else(|| t.strip_prefix("0X"))
        .unwrap_or(t);
    u32::from_str_radix(digits, 16).map_err(|_| RibclParseError::BadStatus(raw.to_string()))
}

fn element_from_start(
    start: &BytesStart<'_>,
    position: u64,
) -> Result<XmlElement, RibclParseError> {
    let name = start.name().as_ref().to_string();
    let mut element = XmlElement::new(name);
    for attr in start.attributes() {
        let attr = attr.map_err(|e| RibclParseError::Malformed {
            position,
            message: e.to_string(),
        })?;
        let key = attr.key.as_ref().to_string();
        let value = attr
            .normalized_value(quick_xml::XmlVersion::Implicit1_0)
            .map_err(|e| RibclParseError::Malformed {
                position,
                message: e.to_string(),
            })?
            .into_owned();
        element.attrs.push((key, value));
    }
    Ok(element)
}

fn snippet(body: &[u8]) -> String {
    let end = body.len().min(40);
    String::from_utf8_lossy(&body[..end]).into_owned()
}

/// Deepest nesting accepted; real replies nest about 6 deep (embedded health).
const MAX_DEPTH: usize = 64;

/// Parses a whole reply body (all documents).
pub fn parse_reply(body: &[u8]) -> Result<RibclReply, RibclParseError> {
    if body.iter().all(|b| b.is_ascii_whitespace()) {
        return Err(RibclParseError::Empty);
    }
    let mut reader = Reader::from_reader(body);
    let config = reader.config_mut();
    config.trim_text(true);
    config.check_end_names = true;

    let mut reply = RibclReply::default();
    // Elements open inside the current document; stack[0] is the RIBCL root.
    let mut stack: Vec<XmlElement> = Vec::new();
    let mut buf = Vec::new();
    loop {
        let position = reader.buffer_position();
        let event = reader.read_event_into(&mut buf).map_err(|e| match e {
            quick_xml::Error::Syntax(_) if stack.is_empty() && reply.documents == 0 => {
                RibclParseError::NotXml {
                    snippet: snippet(body),
                }
            }
            // quick-xml reports an unclosed tag at the end of input as a syntax error.
            quick_xml::Error::Syntax(_) if reader.buffer_position() as usize >= body.len() => {
                RibclParseError::Truncated {
                    open: stack
                        .last()
                        .map(|e| e.name.clone())
                        .unwrap_or_else(|| "a tag".to_string()),
                }
            }
            other => RibclParseError::Malformed {
                position: reader.error_position(),
                message: other.to_string(),
            },
        })?;
        match event {
            Event::Start(start) => {
                let element = element_from_start(&start, position)?;
                if stack.is_empty() {
                    check_root(&element, body)?;
                    reply.documents += 1;
                }
                if stack.len() >= MAX_DEPTH {
                    return Err(RibclParseError::Malformed {
                        position,
                        message: format!("nesting deeper than {MAX_DEPTH}"),
                    });
                }
                stack.push(element);
            }
            Event::Empty(start) => {
                let element = element_from_start(&start, position)?;
                if stack.is_empty() {
                    // `<RIBCL VERSION="2.22"/>`: an empty document some iLO 2 firmware sends.
                    check_root(&element, body)?;
                    reply.documents += 1;
                } else {
                    attach(&mut stack, &mut reply, element)?;
                }
            }
            Event::End(_) => {
                let element = stack.pop().ok_or_else(|| RibclParseError::Malformed {
                    position,
                    message: "closing tag without an opening one".to_string(),
                })?;
                if !stack.is_empty() {
                    attach(&mut stack, &mut reply, element)?;
                }
            }
            Event::Text(text) => {
                let content = text.xml10_content();
                push_text(&mut stack, &content, body, reply.documents)?;
            }
            Event::CData(data) => {
                let content = data.into_inner().into_owned();
                push_text(&mut stack, &content, body, reply.documents)?;
            }
            Event::GeneralRef(reference) => {
                let resolved = match reference.resolve_char_ref() {
                    Ok(Some(c)) => c.to_string(),
                    _ => {
                        let name = reference.xml10_content();
                        quick_xml::escape::resolve_predefined_entity(&name)
                            .map(str::to_string)
                            .ok_or_else(|| RibclParseError::Malformed {
                                position,
                                message: format!("unknown entity &{name};"),
                            })?
                    }
                };
                push_text(&mut stack, &resolved, body, reply.documents)?;
            }
            Event::Decl(_) | Event::Comment(_) | Event::PI(_) | Event::DocType(_) => {}
            Event::Eof => break,
        }
        buf.clear();
    }
    if let Some(open) = stack.last() {
        return Err(RibclParseError::Truncated {
            open: open.name.clone(),
        });
    }
    if reply.documents == 0 {
        return Err(RibclParseError::NotXml {
            snippet: snippet(body),
        });
    }
    if reply.responses.is_empty() {
        return Err(RibclParseError::NoResponse);
    }
    Ok(reply)
}

fn check_root(element: &XmlElement, body: &[u8]) -> Result<(), RibclParseError> {
    if element.name.eq_ignore_ascii_case("RIBCL") {
        Ok(())
    } else if element.name.eq_ignore_ascii_case("html") {
        // A web page (a login portal, a proxy's error page): not RIBCL at all.
        Err(RibclParseError::NotXml {
            snippet: snippet(body),
        })
    } else {
        Err(RibclParseError::WrongRoot {
            root: element.name.clone(),
        })
    }
}

fn push_text(
    stack: &mut [XmlElement],
    content: &str,
    body: &[u8],
    documents: usize,
) -> Result<(), RibclParseError> {
    match stack.last_mut() {
        Some(open) => {
            open.text.push_str(content.trim());
            Ok(())
        }
        None if content.trim().is_empty() => Ok(()),
        // Text outside every element: the body is not (only) XML.
        None if documents == 0 => Err(RibclParseError::NotXml {
            snippet: snippet(body),
        }),
        None => Err(RibclParseError::Malformed {
            position: 0,
            message: format!(
                "text outside any element: {:?}",
                snippet(content.as_bytes())
            ),
        }),
    }
}

/// Attaches a finished element to its parent; RIBCL's direct children become responses or
/// payload.
fn attach(
    stack: &mut [XmlElement],
    reply: &mut RibclReply,
    element: XmlElement,
) -> Result<(), RibclParseError> {
    if stack.len() == 1 {
        if element.name.eq_ignore_ascii_case("RESPONSE") {
            let message = element.get("MESSAGE").unwrap_or("").to_string();
            // Fail closed: a RESPONSE that does not say how the stage went is not a success.
            let Some(status) = element.get("STATUS") else {
                return Err(RibclParseError::MissingStatus { message });
            };
            let status = parse_status(status)?;
            reply.responses.push(RibclResponse { status, message });
        } else {
            reply.payload.push(element);
        }
    } else if let Some(parent) = stack.last_mut() {
        parent.children.push(element);
    }
    Ok(())
}

#[cfg(test)]
pub(crate) mod samples {
    //! Reply bodies shaped like the real iLO 3 captures (docs/ilo-management.md §1.2): declarations, single
    //! quoted MESSAGE on its own line, CRLF/LF mix, one document per stage.

    /// A reply with `payload` in the command's document, the stages around it successful.
    pub fn reply_with(payload: &str) -> String {
        let ok = "<?xml version=\"1.0\"?>\r\n<RIBCL VERSION=\"2.23\">\r\n<RESPONSE\r\n    STATUS=\"0x0000\"\r\n    MESSAGE='No error'\r\n     />\r\n</RIBCL>\r\n";
        format!(
            "{ok}{ok}<?xml version=\"1.0\"?>\r\n<RIBCL VERSION=\"2.23\">\r\n<RESPONSE\r\n    STATUS=\"0x0000\"\r\n    MESSAGE='No error'\r\n     />\n{payload}\n</RIBCL>\r\n{ok}{ok}"
        )
    }

    /// A reply whose command stage fails with `status` and `message`.
    pub fn reply_error(status: &str, message: &str) -> String {
        let ok = "<?xml version=\"1.0\"?>\r\n<RIBCL VERSION=\"2.23\">\r\n<RESPONSE\r\n    STATUS=\"0x0000\"\r\n    MESSAGE='No error'\r\n     />\r\n</RIBCL>\r\n";
        format!(
            "{ok}<?xml version=\"1.0\"?>\r\n<RIBCL VERSION=\"2.23\">\r\n<RESPONSE\r\n    STATUS=\"{status}\"\r\n    MESSAGE='{message}'\r\n     />\r\n</RIBCL>\r\n"
        )
    }
}

#[cfg(test)]
mod tests {
    use super::samples::*;
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn request_matches_proliantutils_shape() {
        let cmd = RibclCommand::read(
            Wrapper::ServerInfo,
            XmlElement::new("GET_HOST_POWER_STATUS"),
        );
        assert_eq!(
            cmd.encode("admin", "p&<\"w"),
            "<RIBCL VERSION=\"2.0\"><LOGIN USER_LOGIN=\"admin\" PASSWORD=\"p&amp;&lt;&quot;w\"><SERVER_INFO MODE=\"read\"><GET_HOST_POWER_STATUS /></SERVER_INFO></LOGIN></RIBCL>\r\n"
        );
    }

    #[test]
    fn every_document_is_read() {
        let body = reply_with("<GET_HOST_POWER\r\n    HOST_POWER=\"ON\"\r\n    />");
        let reply = parse_reply(body.as_bytes()).expect("valid reply");
        assert_eq!(reply.documents, 5);
        assert_eq!(reply.responses.len(), 5);
        assert!(reply.first_error().is_none());
        assert_eq!(
            reply
                .payload("GET_HOST_POWER")
                .and_then(|e| e.get("host_power")),
            Some("ON")
        );
        assert!(reply.informational().is_empty());
    }

    #[test]
    fn error_in_a_later_document_is_seen() {
        let body = reply_error("0x005F", "Login failed.");
        let reply = parse_reply(body.as_bytes()).expect("valid reply");
        let err = reply.first_error().expect("an error status");
        assert_eq!(err.status, 0x5F);
        assert_eq!(err.message, "Login failed.");
    }

    #[test]
    fn informational_messages_are_kept() {
        let body = "<?xml version=\"1.0\"?><RIBCL VERSION=\"2.23\"><RESPONSE STATUS=\"0x0000\" MESSAGE='Host power is already ON.'/></RIBCL>";
        let reply = parse_reply(body.as_bytes()).expect("valid");
        assert_eq!(
            reply.informational(),
            vec!["Host power is already ON.".to_string()]
        );
    }

    #[test]
    fn nested_payload_and_entities() {
        let body = reply_with(
            "<GET_EMBEDDED_HEALTH_DATA><TEMPERATURE><TEMP><LABEL VALUE=\"01-Inlet &amp; Ambient\"/><CURRENTREADING VALUE=\"21\" UNIT=\"Celsius\"/></TEMP></TEMPERATURE></GET_EMBEDDED_HEALTH_DATA>",
        );
        let reply = parse_reply(body.as_bytes()).expect("valid");
        let health = reply.payload("GET_EMBEDDED_HEALTH_DATA").expect("payload");
        let temp = health
            .find("TEMPERATURE")
            .and_then(|t| t.find("TEMP"))
            .expect("temp");
        assert_eq!(temp.child_value("LABEL"), Some("01-Inlet & Ambient"));
    }

    #[test]
    fn faults_are_typed() {
        let cases: Vec<(&[u8], &str)> = vec![
            (b"", "empty"),
            (b"   \r\n", "empty"),
            (b"Internal Server Error", "notxml"),
            (b"{\"error\": 1}", "notxml"),
            (b"<?xml version=\"1.0\"?><html><body>hi</body></html>", "notxml"),
            (b"<?xml version=\"1.0\"?><RESPONSE STATUS=\"0x0000\"/>", "root"),
            (b"<?xml version=\"1.0\"?><RIBCL VERSION=\"2.23\"><RESPONSE STATUS=\"0x0000\" MESSAGE='No error'/>", "trunc"),
            (b"<?xml version=\"1.0\"?><RIBCL VERSION=\"2.23\"><RESPONSE STATUS=\"0x00", "trunc"),
            (b"<?xml version=\"1.0\"?><RIBCL VERSION=\"2.23\"></RIBCL>", "noresp"),
            (b"<?xml version=\"1.0\"?><RIBCL><RESPONSE STATUS=\"zz\" MESSAGE='x'/></RIBCL>", "status"),
            (b"<?xml version=\"1.0\"?><RIBCL><A></B></RIBCL>", "malformed"),
            (b"<?xml version=\"1.0\"?><RIBCL VERSION=\"2.23\"><RESPONSE MESSAGE='No error'/></RIBCL>", "nostatus"),
            (b"<?xml version=\"1.0\"?><RIBCL VERSION=\"2.23\"><RESPONSE/><GET_HOST_POWER HOST_POWER=\"ON\"/></RIBCL>", "nostatus"),
        ];
        for (body, want) in cases {
            let got = parse_reply(body).expect_err("must fail");
            let kind = match got {
                RibclParseError::Empty => "empty",
                RibclParseError::NotXml { .. } => "notxml",
                RibclParseError::WrongRoot { .. } => "root",
                RibclParseError::Truncated { .. } => "trunc",
                RibclParseError::NoResponse => "noresp",
                RibclParseError::BadStatus(_) => "status",
                RibclParseError::MissingStatus { .. } => "nostatus",
                RibclParseError::Malformed { .. } => "malformed",
                _ => "other",
            };
            assert_eq!(kind, want, "{:?} gave {got}", String::from_utf8_lossy(body));
        }
    }

    #[test]
    fn self_closed_ilo2_root_is_accepted() {
        let body = "<?xml version=\"1.0\"?><RIBCL VERSION=\"2.22\"/><?xml version=\"1.0\"?><RIBCL VERSION=\"2.22\"><RESPONSE STATUS=\"0x0000\" MESSAGE='No error'/></RIBCL>";
        let reply = parse_reply(body.as_bytes()).expect("valid");
        assert_eq!(reply.documents, 2);
    }

    fn valid_bodies() -> Vec<String> {
        vec![
            reply_with("<GET_HOST_POWER HOST_POWER=\"ON\"/>"),
            reply_with("<GET_VM_STATUS VM_APPLET=\"DISCONNECTED\" DEVICE=\"CDROM\" BOOT_OPTION=\"NO_BOOT\" WRITE_PROTECT=\"NO\" IMAGE_INSERTED=\"NO\" IMAGE_URL=\"\" />"),
            reply_with("<PERSISTENT_BOOT><DEVICE value=\"Boot000B\" DESCRIPTION=\"iLO Virtual USB 2 : HP iLO Virtual USB CD/DVD ROM\"/></PERSISTENT_BOOT>"),
            reply_error("0x005F", "Login failed."),
        ]
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(512))]

        /// Random bytes never panic the parser.
        #[test]
        fn random_bodies_never_panic(body in proptest::collection::vec(any::<u8>(), 0..512)) {
            let _ = parse_reply(&body);
        }

        /// Random text with markup characters never panics it either.
        #[test]
        fn random_markup_never_panics(body in "[<>/?!=\"' a-zA-Z_0-9&;#x\\r\\n-]{0,300}") {
            let _ = parse_reply(body.as_bytes());
        }

        /// Mutated valid replies (truncated, a byte flipped, a slice spliced) never panic, and a
        /// successful parse of a truncation always has a RESPONSE.
        #[test]
        fn mutated_replies_never_panic(
            which in 0usize..4,
            cut in any::<prop::sample::Index>(),
            flip in any::<prop::sample::Index>(),
            byte in any::<u8>(),
            splice in any::<prop::sample::Index>(),
        ) {
            let bodies = valid_bodies();
            let body = bodies[which].as_bytes();
            let truncated = &body[..cut.index(body.len() + 1)];
            if let Ok(reply) = parse_reply(truncated) {
                prop_assert!(!reply.responses.is_empty());
            }
            let mut flipped = body.to_vec();
            let i = flip.index(flipped.len());
            flipped[i] = byte;
            let _ = parse_reply(&flipped);
            let j = splice.index(body.len());
            let mut spliced = body[j..].to_vec();
            spliced.extend_from_slice(&body[..j]);
            let _ = parse_reply(&spliced);
        }

        /// A valid reply with the STATUS of any one RESPONSE taken out is an error, never a
        /// success (fail closed), whichever stage lost it.
        #[test]
        fn a_response_without_status_is_an_error(which in 0usize..4, pick in any::<prop::sample::Index>()) {
            let body = &valid_bodies()[which];
            let statuses: Vec<usize> = body.match_indices("STATUS=\"").map(|(i, _)| i).collect();
            let start = statuses[pick.index(statuses.len())];
            let len = body[start..].find("\"\r\n").map(|end| end + 1).unwrap_or(0);
            prop_assert!(len > 0, "every sample puts STATUS on its own line");
            let stripped = format!("{}{}", &body[..start], &body[start + len..]);
            let got = parse_reply(stripped.as_bytes());
            prop_assert!(
                matches!(got, Err(RibclParseError::MissingStatus { .. })),
                "{stripped:?} gave {got:?}"
            );
        }
    }
}
