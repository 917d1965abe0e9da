//! HTTP/1.1 responses as the agent's image stream reads them from an image server
//! (`stream::source::wire`): the head (`Conn::read_head`, `parse_head`, `content_length`), the
//! body framing (`Body`: Content-Length or chunked) and the resume logic's `Content-Range`
//! reader. A body can never yield more bytes than arrived.
#![no_main]

use std::io::Cursor;

use libfuzzer_sys::fuzz_target;
use vmdeploy_agent::stream::source::resume::content_range_start;
use vmdeploy_agent::stream::source::wire::{head_end, parse_head, Body, Conn};

fuzz_target!(|data: &[u8]| {
    if let Some(end) = head_end(data) {
        assert!(end <= data.len());
    }
    let mut conn = Conn::new(Cursor::new(data));
    let Ok(head_bytes) = conn.read_head() else {
        return;
    };
    assert!(head_bytes.len() <= data.len());
    let head = match parse_head(&head_bytes) {
        Ok(h) => h,
        Err(e) => {
            assert!(!e.is_empty());
            return;
        }
    };
    assert!((100..=599).contains(&head.status));
    let length = head.content_length();
    let _ = head.is_chunked();
    if let Some(range) = head.header("content-range") {
        let _ = content_range_start(range);
    }
    let Ok(mut body) = Body::new(conn, &head) else {
        return;
    };
    let mut total = 0usize;
    let mut buf = [0u8; 4096];
    loop {
        match body.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => {
                assert!(n <= buf.len());
                total += n;
                assert!(
                    total <= data.len(),
                    "{total} body bytes from {} input bytes",
                    data.len()
                );
            }
            Err(e) => {
                assert!(!e.to_string().is_empty());
                break;
            }
        }
    }
    if let (Ok(Some(len)), false) = (length, head.is_chunked()) {
        assert!(
            total as u64 <= len,
            "read {total} bytes of a {len}-byte body"
        );
    }
});
