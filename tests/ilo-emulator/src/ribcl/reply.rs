//! The reply side of RIBCL: several `<?xml version="1.0"?>` documents back to back, one per stage
//! of the request, each with a RESPONSE and, for the command that returns data, its payload after
//! the RESPONSE in the same document (docs/ilo-management.md §1.2; the layout copies the iLO 3 captures:
//! RESPONSE attributes on their own lines, MESSAGE in single quotes).

use crate::xml::{escape, escape_single_quoted};

/// The RIBCL version a Gen8 (iLO 4) reports.
const RIBCL_VERSION: &str = "2.23";

/// RIBCL status codes used by the emulator (docs/ilo-management.md §1.4).
pub mod status {
    /// No error (also informational messages).
    pub const OK: u16 = 0x0000;
    /// Generic severe error / syntax error.
    pub const SEVERE: u16 = 0x0001;
    /// Invalid virtual media option.
    pub const INVALID_VM_OPTION: u16 = 0x0035;
    /// Feature not supported.
    pub const NOT_SUPPORTED: u16 = 0x003C;
    /// Login failed.
    pub const LOGIN_FAILED: u16 = 0x005F;
}

/// A RIBCL error status and message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RibclStatus {
    /// STATUS.
    pub code: u16,
    /// MESSAGE.
    pub message: String,
}

impl RibclStatus {
    /// A status.
    pub fn new(code: u16, message: impl Into<String>) -> Self {
        RibclStatus {
            code,
            message: message.into(),
        }
    }

    /// The syntax error iLO answers for an unknown command or one in the wrong block.
    pub fn syntax_error(near: &str) -> Self {
        RibclStatus::new(
            status::SEVERE,
            format!("Syntax error: Line #0: syntax error near \"{near}\" in the line: \"\"."),
        )
    }
}

/// The documents of one reply.
#[derive(Debug, Default, Clone)]
pub struct RibclReply {
    docs: Vec<String>,
}

impl RibclReply {
    /// A document with a RESPONSE and an optional payload.
    pub fn push(&mut self, code: u16, message: &str, payload: &str) {
        let mut doc = String::with_capacity(160 + payload.len());
        doc.push_str("<?xml version=\"1.0\"?>\r\n<RIBCL VERSION=\"");
        doc.push_str(RIBCL_VERSION);
        doc.push_str("\">\n<RESPONSE\n    STATUS=\"");
        doc.push_str(&format!("0x{code:04X}"));
        doc.push_str("\"\n    MESSAGE='");
        doc.push_str(&escape_single_quoted(message));
        doc.push_str("'\n     />\n");
        doc.push_str(payload);
        doc.push_str("</RIBCL>\n");
        self.docs.push(doc);
    }

    /// A `No error` document.
    pub fn ok(&mut self) {
        self.push(status::OK, "No error", "");
    }

    /// A `No error` document carrying a payload.
    pub fn data(&mut self, payload: &str) {
        self.push(status::OK, "No error", payload);
    }

    /// An error document.
    pub fn error(&mut self, s: &RibclStatus) {
        self.push(s.code, &s.message, "");
    }

    /// The documents, to be sent as separate chunks.
    pub fn into_docs(self) -> Vec<String> {
        self.docs
    }
}

/// Builds payload elements in the iLO layout (attributes on their own lines).
pub fn element(name: &str, attrs: &[(&str, &str)]) -> String {
    let mut s = format!("<{name}");
    for (k, v) in attrs {
        s.push_str(&format!("\n    {k}=\"{}\"", escape(v)));
    }
    s.push_str("\n    />\n");
    s
}

/// `<OUTER><INNER VALUE="v"/></OUTER>`, the shape of most "get" payloads.
pub fn value_in(outer: &str, inner: &str, value: &str) -> String {
    format!(
        "<{outer}>\n    <{inner} VALUE=\"{}\"/>\n</{outer}>\n",
        escape(value)
    )
}
