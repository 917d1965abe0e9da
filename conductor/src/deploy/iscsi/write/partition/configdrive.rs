//! The config drive of `instance_info.configdrive`: [`load`] fetches a URL with the conductor's
//! HTTP client, then [`decode`]s it with the shared decoder
//! (`vmdeploy_shared::partition::configdrive`, which the agent uses too).

use std::time::Duration;

use vmdeploy_shared::partition::configdrive::is_url;
pub use vmdeploy_shared::partition::configdrive::{
    decode, ConfigDriveError, MAX_CONFIGDRIVE_BYTES, MAX_DOWNLOAD_BYTES,
};

/// How long fetching a config drive URL may take in all.
const FETCH_TIMEOUT: Duration = Duration::from_secs(120);

/// The config drive image of `value` (`instance_info.configdrive`): fetched first when it is an
/// http(s) URL, then [`decode`]d.
pub async fn load(value: &str) -> Result<Vec<u8>, ConfigDriveError> {
    let trimmed = value.trim();
    if is_url(trimmed) {
        let body = fetch(trimmed).await?;
        decode(&body, true)
    } else {
        decode(trimmed.as_bytes(), false)
    }
}

async fn fetch(url: &str) -> Result<Vec<u8>, ConfigDriveError> {
    let shown = crate::image_cache::error::shown_url(url);
    let failed = |reason: String| ConfigDriveError::Fetch {
        url: shown.clone(),
        reason,
    };
    let client =
        crate::image_cache::fetch::build_client(&crate::image_cache::FetchPolicy::default())
            .map_err(|e| failed(e.to_string()))?;
    let mut response = client
        .get(url)
        .timeout(FETCH_TIMEOUT)
        .send()
        .await
        .map_err(|e| failed(e.without_url().to_string()))?;
    if !response.status().is_success() {
        return Err(failed(format!("the server answered {}", response.status())));
    }
    let mut body = Vec::new();
    while let Some(chunk) = response
        .chunk()
        .await
        .map_err(|e| failed(e.without_url().to_string()))?
    {
        if (body.len() + chunk.len()) as u64 > MAX_DOWNLOAD_BYTES {
            return Err(failed(format!(
                "the download is larger than {} MiB, more than any config drive within the \
                 {} MiB limit",
                MAX_DOWNLOAD_BYTES >> 20,
                MAX_CONFIGDRIVE_BYTES >> 20
            )));
        }
        body.extend_from_slice(&chunk);
    }
    Ok(body)
}

#[cfg(test)]
mod tests {
    use vmdeploy_shared::partition::configdrive::test_support::{b64, gzip, iso};

    use super::*;

    /// A one-request HTTP server on loopback answering `status` with `body`; its URL.
    async fn serve_once(status: &'static str, body: Vec<u8>) -> String {
        use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("binding loopback");
        let addr = listener.local_addr().expect("local address");
        tokio::spawn(async move {
            if let Ok((mut conn, _)) = listener.accept().await {
                let mut request = [0u8; 4096];
                let _ = conn.read(&mut request).await;
                let head = format!(
                    "HTTP/1.1 {status}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
                    body.len()
                );
                let _ = conn.write_all(head.as_bytes()).await;
                let _ = conn.write_all(&body).await;
            }
        });
        format!("http://{addr}/configdrive")
    }

    #[tokio::test]
    async fn a_url_is_fetched_then_decoded() {
        let image = iso(40_000);
        let url = serve_once("200 OK", b64(&gzip(&image)).into_bytes()).await;
        assert_eq!(load(&url).await.ok(), Some(image.clone()));
        // Inline text works the same way.
        assert_eq!(load(&b64(&gzip(&image))).await.ok(), Some(image));

        let url = serve_once("404 Not Found", b"no such object".to_vec()).await;
        let err = load(&url).await.expect_err("404");
        assert!(matches!(err, ConfigDriveError::Fetch { .. }), "{err}");
        assert!(err.to_string().contains("404"), "{err}");
    }
}
