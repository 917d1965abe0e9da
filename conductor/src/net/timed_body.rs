//! A request body that must arrive whole within a deadline.
//!
//! # Design
//! hyper bounds how long a client may take over a request's headers, not over its body: a
//! client that announces a body and then stalls would hold its connection, and a handler that
//! reads the body first (the ramdisk call-backs, which are public), for ever. Each request's
//! body is wrapped in a [`TimedBody`] whose deadline starts when the headers are in; past it
//! the next read fails with [`BodyTimedOut`], which the API answers with 408 and the
//! connection closes. A body nobody reads costs nothing: the timer is armed at the first poll.

use std::future::Future as _;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use http_body::{Body, Frame, SizeHint};
use tokio::time::{Instant, Sleep};

/// The body did not arrive within its deadline.
#[derive(Debug, thiserror::Error)]
#[error("the request body did not arrive within {0:?}")]
pub struct BodyTimedOut(pub Duration);

/// `inner`, failing once `timeout` has passed since [`TimedBody::new`].
#[derive(Debug)]
pub struct TimedBody<B> {
    inner: B,
    timeout: Duration,
    deadline: Instant,
    sleep: Option<Pin<Box<Sleep>>>,
}

impl<B> TimedBody<B> {
    /// `inner` with `timeout` from now.
    pub fn new(inner: B, timeout: Duration) -> TimedBody<B> {
        TimedBody {
            inner,
            timeout,
            deadline: Instant::now() + timeout,
            sleep: None,
        }
    }
}

impl<B> Body for TimedBody<B>
where
    B: Body + Unpin,
    B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    type Data = B::Data;
    type Error = Box<dyn std::error::Error + Send + Sync>;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Self::Data>, Self::Error>>> {
        let this = &mut *self;
        if let Poll::Ready(frame) = Pin::new(&mut this.inner).poll_frame(cx) {
            return Poll::Ready(frame.map(|r| r.map_err(Into::into)));
        }
        let deadline = this.deadline;
        let sleep = this
            .sleep
            .get_or_insert_with(|| Box::pin(tokio::time::sleep_until(deadline)));
        match sleep.as_mut().poll(cx) {
            Poll::Ready(()) => Poll::Ready(Some(Err(Box::new(BodyTimedOut(this.timeout))))),
            Poll::Pending => Poll::Pending,
        }
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

/// Whether `err` or one of its sources is a [`BodyTimedOut`].
pub fn is_body_timeout(err: &(dyn std::error::Error + 'static)) -> bool {
    let mut next = Some(err);
    while let Some(e) = next {
        if e.is::<BodyTimedOut>() {
            return true;
        }
        next = e.source();
    }
    false
}

#[cfg(test)]
mod tests {
    use super::*;
    use http_body_util::BodyExt as _;

    /// A body that never yields a frame.
    struct Stalled;

    impl Body for Stalled {
        type Data = bytes::Bytes;
        type Error = std::io::Error;

        fn poll_frame(
            self: Pin<&mut Self>,
            _: &mut Context<'_>,
        ) -> Poll<Option<Result<Frame<Self::Data>, Self::Error>>> {
            Poll::Pending
        }
    }

    #[tokio::test]
    async fn a_whole_body_in_time_passes_and_a_stalled_one_fails() {
        let whole = TimedBody::new(
            http_body_util::Full::new(bytes::Bytes::from_static(b"{}")),
            Duration::from_millis(50),
        );
        let bytes = whole.collect().await.expect("in time").to_bytes();
        assert_eq!(&bytes[..], b"{}");

        // A body whose client never sends: the deadline ends it.
        let started = std::time::Instant::now();
        let err = TimedBody::new(Stalled, Duration::from_millis(100))
            .collect()
            .await
            .expect_err("stalled");
        assert!(is_body_timeout(err.as_ref()), "{err}");
        assert!(started.elapsed() >= Duration::from_millis(100));
        assert!(started.elapsed() < Duration::from_secs(5));
    }
}
