//! A small element tree for RIBCL requests, and XML escaping for replies.
//!
//! Tag and attribute names are folded to upper case: clients differ in case (proliantutils sends
//! `value=` on SET_ONE_TIME_BOOT but `VALUE=` on VM_BOOT_OPTION; python-hpilo the other way round;
//! docs/ilo-management.md §1.5 "Attribute names must be matched case-insensitively").

use quick_xml::events::{BytesStart, Event};
use quick_xml::Reader;

/// Limits that keep a hostile request from costing much.
const MAX_DEPTH: usize = 32;
const MAX_ELEMENTS: usize = 4096;

/// An element: upper-cased name, attributes (upper-cased names), children, text.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Element {
    /// Tag name, upper case.
    pub name: String,
    /// Attributes in document order, names upper case, values unescaped.
    pub attrs: Vec<(String, String)>,
    /// Child elements.
    pub children: Vec<Element>,
    /// Concatenated text content.
    pub text: String,
}

impl Element {
    /// An attribute by (upper-case) name.
    pub fn attr(&self, name: &str) -> Option<&str> {
        self.attrs
            .iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.as_str())
    }

    /// The first child with this (upper-case) name.
    pub fn child(&self, name: &str) -> Option<&Element> {
        self.children.iter().find(|c| c.name == name)
    }
}

/// Why a request could not be parsed.
#[derive(Debug, thiserror::Error)]
pub enum XmlError {
    /// Malformed XML.
    #[error("malformed XML at byte {position}: {reason}")]
    Malformed {
        /// Byte offset.
        position: u64,
        /// Parser message.
        reason: String,
    },
    /// No root element.
    #[error("no root element")]
    Empty,
    /// Nesting or size beyond the limits.
    #[error("request too deeply nested or too large")]
    TooLarge,
}

fn start(e: &BytesStart<'_>, position: u64) -> Result<Element, XmlError> {
    let malformed = |reason: String| XmlError::Malformed { position, reason };
    let name = e.name().into_inner().to_ascii_uppercase();
    let mut attrs = Vec::new();
    for attr in e.attributes().with_checks(false) {
        let attr = attr.map_err(|err| malformed(err.to_string()))?;
        let key = attr.key.into_inner().to_ascii_uppercase();
        let value = attr
            .normalized_value(quick_xml::XmlVersion::Implicit1_0)
            .map_err(|err| malformed(err.to_string()))?
            .into_owned();
        attrs.push((key, value));
    }
    Ok(Element {
        name,
        attrs,
        ..Element::default()
    })
}

/// Parses one document; text before the root (a declaration, CRLFs) is skipped.
pub fn parse(text: &str) -> Result<Element, XmlError> {
    let mut reader = Reader::from_str(text);
    reader.config_mut().trim_text(true);
    let mut stack: Vec<Element> = Vec::new();
    let mut count = 0usize;
    loop {
        let position = reader.buffer_position();
        let event = reader.read_event().map_err(|e| XmlError::Malformed {
            position,
            reason: e.to_string(),
        })?;
        match event {
            Event::Start(e) => {
                count += 1;
                if stack.len() >= MAX_DEPTH || count > MAX_ELEMENTS {
                    return Err(XmlError::TooLarge);
                }
                stack.push(start(&e, position)?);
            }
            Event::Empty(e) => {
                count += 1;
                if count > MAX_ELEMENTS {
                    return Err(XmlError::TooLarge);
                }
                let element = start(&e, position)?;
                match stack.last_mut() {
                    Some(parent) => parent.children.push(element),
                    None => return Ok(element),
                }
            }
            Event::End(_) => {
                let done = stack.pop().ok_or(XmlError::Malformed {
                    position,
                    reason: "unbalanced end tag".into(),
                })?;
                match stack.last_mut() {
                    Some(parent) => parent.children.push(done),
                    None => return Ok(done),
                }
            }
            Event::Text(t) => {
                if let Some(top) = stack.last_mut() {
                    top.text.push_str(&t.xml10_content());
                }
            }
            Event::Eof => {
                return Err(if stack.is_empty() {
                    XmlError::Empty
                } else {
                    XmlError::Malformed {
                        position,
                        reason: "unexpected end of document".into(),
                    }
                })
            }
            _ => {}
        }
    }
}

/// Escapes text for an attribute value in double quotes (or single quotes) or element text.
pub fn escape(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&apos;"),
            c => out.push(c),
        }
    }
    out
}

/// Escapes text for an attribute value in single quotes (RIBCL's `MESSAGE='...'`): double
/// quotes stay literal, as in iLO's `syntax error near "X"` messages.
pub fn escape_single_quoted(s: &str) -> String {
    escape(s).replace("&quot;", "\"")
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn parses_proliantutils_request_with_case_folding() {
        let e = parse("<RIBCL VERSION=\"2.0\"><LOGIN USER_LOGIN=\"u\" PASSWORD=\"p&amp;q\"><SERVER_INFO MODE=\"write\"><SET_ONE_TIME_BOOT value=\"CDROM\" /></SERVER_INFO></LOGIN></RIBCL>\r\n")
            .expect("valid");
        assert_eq!(e.name, "RIBCL");
        let login = e.child("LOGIN").expect("login");
        assert_eq!(login.attr("PASSWORD"), Some("p&q"));
        let cmd = &login.children[0].children[0];
        assert_eq!(
            (cmd.name.as_str(), cmd.attr("VALUE")),
            ("SET_ONE_TIME_BOOT", Some("CDROM"))
        );
    }

    #[test]
    fn skips_declaration_and_rejects_garbage() {
        let e = parse("<?xml version=\"1.0\"?>\r\n<ribcl version=\"2.0\"></ribcl>").expect("valid");
        assert_eq!(e.name, "RIBCL");
        assert!(parse("").is_err());
        assert!(parse("<A><B></A>").is_err());
        assert!(parse("<A>").is_err());
    }

    #[test]
    fn deep_nesting_is_refused() {
        let doc = "<A>".repeat(100) + &"</A>".repeat(100);
        assert!(matches!(parse(&doc), Err(XmlError::TooLarge)));
    }

    proptest! {
        #[test]
        fn parse_never_panics(s in ".{0,400}") {
            let _ = parse(&s);
        }

        #[test]
        fn escaped_attribute_round_trips(v in "[ -~]{0,40}") {
            let doc = format!("<X A=\"{}\"/>", escape(&v));
            let e = parse(&doc).expect("escaped document parses");
            prop_assert_eq!(e.attr("A"), Some(v.as_str()));
        }
    }
}
