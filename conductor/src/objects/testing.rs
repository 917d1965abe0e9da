//! The [`ObjectStore`] contract as one test suite, run against every store (the built-in one
//! in its unit tests, real Swift in `tests/integration/tests/objects_swift.rs`), so the two
//! cannot drift apart where the flows depend on them: metadata as Swift keeps it, a metadata
//! change that leaves the bytes and the deletion time alone, and `NotFound` for what is gone.
//!
//! Each call works on objects of its own (a fresh UUID in the name), so it can share a
//! container with other tests.

use std::collections::BTreeMap;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use bytes::Bytes;

use super::{ObjectBody, ObjectError, ObjectPath, ObjectStore, PutOptions};

fn now() -> i64 {
    let secs = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    i64::try_from(secs).unwrap_or(i64::MAX)
}

fn meta(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
    pairs
        .iter()
        .map(|(k, v)| ((*k).to_string(), (*v).to_string()))
        .collect()
}

/// GETs a temp URL; the built-in store's certificate is generated, so it is not checked here
/// (BMCs do not check it either, docs/architecture.md §6a).
async fn fetch(url: &str) -> (u16, Vec<u8>) {
    let client = reqwest::Client::builder()
        .danger_accept_invalid_certs(true)
        .no_proxy()
        .build()
        .expect("a test HTTP client");
    let reply = client
        .get(url)
        .send()
        .await
        .unwrap_or_else(|e| panic!("GET {url}: {e}"));
    let status = reply.status().as_u16();
    let body = reply.bytes().await.expect("the body").to_vec();
    (status, body)
}

/// Runs every contract check against `store`, with objects in `container`.
pub async fn object_store_contract_suite(store: &dyn ObjectStore, container: &str) {
    let run = uuid::Uuid::new_v4().simple().to_string();
    let path = ObjectPath::new(container, format!("contract-{run}/counted"));
    let body: Vec<u8> = (0..10_000u32)
        .map(|i| u8::try_from(i % 251).expect("below 251"))
        .collect();

    // A put with a deadline and two metadata keys: both come back, lower case.
    store
        .put(
            &path,
            ObjectBody::Bytes(Bytes::from(body.clone())),
            &PutOptions {
                delete_after: Some(Duration::from_secs(600)),
                metadata: meta(&[("usage-count", "1"), ("Purpose", "contract")]),
            },
        )
        .await
        .expect("put");
    let before = store.head(&path).await.expect("head after put");
    assert_eq!(before.size, 10_000);
    assert_eq!(
        before.metadata,
        meta(&[("usage-count", "1"), ("purpose", "contract")])
    );
    let delete_at = before
        .delete_at
        .expect("a put with delete_after has a deletion time")
        .unix_timestamp();
    assert!(
        (now() + 590..=now() + 601).contains(&delete_at),
        "delete_at {delete_at}, now {}",
        now()
    );

    // set_metadata replaces the whole set (a Swift POST) and keeps bytes and deadline.
    store
        .set_metadata(&path, &meta(&[("Usage-Count", "2")]))
        .await
        .expect("set_metadata");
    let after = store.head(&path).await.expect("head after set_metadata");
    assert_eq!(after.metadata, meta(&[("usage-count", "2")]));
    assert_eq!(after.size, 10_000);
    assert_eq!(
        after.delete_at.map(|t| t.unix_timestamp()),
        Some(delete_at),
        "set_metadata must keep the deletion time"
    );
    let url = store
        .temp_url(&path, Duration::from_secs(60))
        .await
        .expect("temp URL");
    assert_eq!(
        fetch(&url).await,
        (200, body.clone()),
        "bytes after set_metadata"
    );

    // Changing it again, then to nothing at all.
    store
        .set_metadata(&path, &meta(&[("usage-count", "3"), ("other", "x y")]))
        .await
        .expect("set_metadata again");
    assert_eq!(
        store.head(&path).await.expect("head").metadata,
        meta(&[("other", "x y"), ("usage-count", "3")])
    );
    store
        .set_metadata(&path, &BTreeMap::new())
        .await
        .expect("set_metadata to an empty set");
    assert_eq!(
        store.head(&path).await.expect("head").metadata,
        BTreeMap::new()
    );

    // An object without a deadline keeps having none.
    let lasting = ObjectPath::new(container, format!("contract-{run}/lasting"));
    store
        .put(
            &lasting,
            ObjectBody::Bytes(Bytes::from_static(b"iso")),
            &PutOptions {
                delete_after: None,
                metadata: meta(&[("usage-count", "1")]),
            },
        )
        .await
        .expect("put without a deadline");
    store
        .set_metadata(&lasting, &meta(&[("usage-count", "7")]))
        .await
        .expect("set_metadata");
    let info = store.head(&lasting).await.expect("head");
    assert_eq!(
        (info.size, info.delete_at, info.metadata),
        (3, None, meta(&[("usage-count", "7")]))
    );

    // What is not there: NotFound, before and after a delete; bad names never reach the store.
    let missing = ObjectPath::new(container, format!("contract-{run}/missing"));
    let err = store
        .set_metadata(&missing, &meta(&[("usage-count", "1")]))
        .await
        .expect_err("set_metadata of a missing object");
    assert!(
        matches!(&err, ObjectError::NotFound(p) if *p == missing),
        "{err}"
    );
    for p in [&path, &lasting] {
        assert!(store.delete(p).await.expect("delete"), "{p}");
        let err = store
            .set_metadata(p, &meta(&[("usage-count", "1")]))
            .await
            .expect_err("set_metadata of a deleted object");
        assert!(matches!(err, ObjectError::NotFound(_)), "{err}");
        assert!(matches!(store.head(p).await, Err(ObjectError::NotFound(_))));
    }
    let err = store
        .set_metadata(&ObjectPath::new(container, "a/../b"), &BTreeMap::new())
        .await
        .expect_err("a bad name");
    assert!(err.to_string().contains("invalid"), "{err}");
}
