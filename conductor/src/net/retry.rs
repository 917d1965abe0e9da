//! The one retry policy of the conductor's clients: a bounded number of attempts, exponential
//! back-off with a cap, and an optional deadline over the whole operation.
//!
//! # Design
//! The pause before attempt `n + 1` is `initial_backoff × 2^(n-1)`, at most `max_backoff`
//! (a cap equal to the initial pause gives a fixed interval). Which failures are worth another
//! try is decided by the caller ([`RetryPolicy::run`]'s `is_transient`): only the caller knows
//! whether a failed request may have run (a write whose answer was lost must not be sent again)
//! and which of its errors a second try can cure. With a deadline, an attempt still running at
//! the deadline is abandoned ([`RetryError::DeadlineExceeded`]) and a retry is started only when
//! its pause ends before the deadline; otherwise the last failure is returned at once rather
//! than after a sleep that could not help.
//!
//! Each caller logs its retries with its own fields through `on_retry` (an iLO's URL, an
//! agent's command), so a log reader sees which endpoint failed.

use std::future::Future;
use std::time::Duration;

use tokio::time::Instant;

/// Attempts, back-off and deadline of one operation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RetryPolicy {
    /// Attempts in all, the first included (0 is taken as 1).
    pub attempts: u32,
    /// Pause before the second attempt; doubled before each later one.
    pub initial_backoff: Duration,
    /// The longest pause.
    pub max_backoff: Duration,
    /// Bound on the whole operation, attempts and pauses included.
    pub deadline: Option<Duration>,
}

/// One retry about to happen, for the caller's log line.
#[derive(Debug)]
pub struct Retrying<'a, E> {
    /// The attempt that failed (1 for the first).
    pub failed: u32,
    /// Attempts allowed in all.
    pub attempts: u32,
    /// Why it failed.
    pub error: &'a E,
    /// The pause before the next attempt.
    pub pause: Duration,
}

/// Why [`RetryPolicy::run`] gave up.
#[derive(Debug, PartialEq, Eq)]
pub enum RetryError<E> {
    /// The caller called this failure permanent: it was not retried.
    Permanent {
        /// The failure.
        error: E,
        /// Attempts made.
        attempts: u32,
    },
    /// Every attempt failed transiently, or the next pause would have ended past the deadline.
    Exhausted {
        /// The last attempt's failure.
        last: E,
        /// Attempts made.
        attempts: u32,
    },
    /// The deadline passed while an attempt ran; it was abandoned.
    DeadlineExceeded {
        /// Attempts made, the abandoned one included.
        attempts: u32,
    },
}

impl<E> RetryError<E> {
    /// Attempts made.
    pub fn attempts(&self) -> u32 {
        match self {
            RetryError::Permanent { attempts, .. }
            | RetryError::Exhausted { attempts, .. }
            | RetryError::DeadlineExceeded { attempts } => *attempts,
        }
    }

    /// The last failure, when an attempt ended with one (not at a deadline).
    pub fn into_last(self) -> Option<E> {
        match self {
            RetryError::Permanent { error, .. } => Some(error),
            RetryError::Exhausted { last, .. } => Some(last),
            RetryError::DeadlineExceeded { .. } => None,
        }
    }
}

impl RetryPolicy {
    /// `attempts` in all, `initial_backoff` doubled with no cap, no deadline.
    pub const fn new(attempts: u32, initial_backoff: Duration) -> RetryPolicy {
        RetryPolicy {
            attempts,
            initial_backoff,
            max_backoff: Duration::MAX,
            deadline: None,
        }
    }

    /// The same policy with pauses of at most `max_backoff`.
    pub const fn capped_at(mut self, max_backoff: Duration) -> RetryPolicy {
        self.max_backoff = max_backoff;
        self
    }

    /// The same policy bounded by `deadline` from the start of [`RetryPolicy::run`].
    pub const fn with_deadline(mut self, deadline: Duration) -> RetryPolicy {
        self.deadline = Some(deadline);
        self
    }

    /// Attempts in all, at least 1.
    pub fn max_attempts(&self) -> u32 {
        self.attempts.max(1)
    }

    /// The pause after attempt `failed` (1-based) fails.
    pub fn pause_after(&self, failed: u32) -> Duration {
        let doublings = failed.saturating_sub(1).min(31);
        self.initial_backoff
            .saturating_mul(1u32 << doublings)
            .min(self.max_backoff)
    }

    /// Runs `attempt(n)` for n = 1, 2, … until it succeeds, fails in a way `is_transient` calls
    /// permanent, the attempts run out or the deadline passes. `on_retry` is told before each
    /// pause.
    pub async fn run<T, E, Op, Fut>(
        &self,
        is_transient: impl Fn(&E) -> bool,
        mut on_retry: impl FnMut(Retrying<'_, E>),
        mut attempt: Op,
    ) -> Result<T, RetryError<E>>
    where
        Op: FnMut(u32) -> Fut,
        Fut: Future<Output = Result<T, E>>,
    {
        let deadline = self.deadline.map(|d| Instant::now() + d);
        let attempts = self.max_attempts();
        let mut tries = 0;
        loop {
            tries += 1;
            let outcome = match deadline {
                Some(at) => match tokio::time::timeout_at(at, attempt(tries)).await {
                    Ok(outcome) => outcome,
                    Err(_) => return Err(RetryError::DeadlineExceeded { attempts: tries }),
                },
                None => attempt(tries).await,
            };
            let error = match outcome {
                Ok(value) => return Ok(value),
                Err(error) if !is_transient(&error) => {
                    return Err(RetryError::Permanent {
                        error,
                        attempts: tries,
                    })
                }
                Err(error) => error,
            };
            let pause = self.pause_after(tries);
            let fits = deadline.is_none_or(|at| Instant::now() + pause < at);
            if tries >= attempts || !fits {
                return Err(RetryError::Exhausted {
                    last: error,
                    attempts: tries,
                });
            }
            on_retry(Retrying {
                failed: tries,
                attempts,
                error: &error,
                pause,
            });
            tokio::time::sleep(pause).await;
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Mutex;

    use super::*;

    #[derive(Debug, PartialEq, Eq)]
    enum Failure {
        Busy,
        Refused,
    }

    /// Runs `policy` over `outcomes` (one per attempt, the last repeated) and records when each
    /// attempt started (since the start, paused time) and each `on_retry`.
    async fn drive(
        policy: RetryPolicy,
        outcomes: &[Result<u32, Failure>],
    ) -> (
        Result<u32, RetryError<Failure>>,
        Vec<Duration>,
        Vec<(u32, Duration)>,
    ) {
        let start = Instant::now();
        let started = Mutex::new(Vec::new());
        let mut told = Vec::new();
        let result = policy
            .run(
                |e| *e == Failure::Busy,
                |r| told.push((r.failed, r.pause)),
                |n| {
                    started.lock().expect("not poisoned").push(start.elapsed());
                    let i = (n as usize - 1).min(outcomes.len() - 1);
                    let outcome = match &outcomes[i] {
                        Ok(v) => Ok(*v),
                        Err(Failure::Busy) => Err(Failure::Busy),
                        Err(Failure::Refused) => Err(Failure::Refused),
                    };
                    async move { outcome }
                },
            )
            .await;
        (result, started.into_inner().expect("not poisoned"), told)
    }

    fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }

    /// Runs `policy` over an attempt that is always busy and asserts it gives up after
    /// `attempts` with the last failure, the attempts starting at `starts_ms`, and returns as
    /// the last attempt fails (no pause after it).
    async fn assert_busy_until_exhausted(policy: RetryPolicy, attempts: u32, starts_ms: &[u64]) {
        let start = Instant::now();
        let (result, started, _) = drive(policy, &[Err(Failure::Busy)]).await;
        assert_eq!(
            result,
            Err(RetryError::Exhausted {
                last: Failure::Busy,
                attempts
            })
        );
        let starts: Vec<Duration> = starts_ms.iter().copied().map(ms).collect();
        assert_eq!(started, starts);
        assert_eq!(start.elapsed(), *starts.last().expect("an attempt"));
    }

    #[tokio::test(start_paused = true)]
    async fn transient_failures_are_retried_with_doubling_pauses() {
        let policy = RetryPolicy::new(4, ms(500));
        let (result, started, told) =
            drive(policy, &[Err(Failure::Busy), Err(Failure::Busy), Ok(7)]).await;
        assert_eq!(result, Ok(7));
        assert_eq!(started, vec![ms(0), ms(500), ms(1500)]);
        assert_eq!(told, vec![(1, ms(500)), (2, ms(1000))]);
    }

    #[tokio::test(start_paused = true)]
    async fn attempts_run_out_with_the_last_failure() {
        assert_busy_until_exhausted(RetryPolicy::new(3, ms(250)), 3, &[0, 250, 750]).await;
    }

    #[tokio::test(start_paused = true)]
    async fn a_permanent_failure_is_not_retried() {
        let policy = RetryPolicy::new(5, ms(100));
        let (result, started, told) =
            drive(policy, &[Err(Failure::Busy), Err(Failure::Refused), Ok(1)]).await;
        assert_eq!(
            result,
            Err(RetryError::Permanent {
                error: Failure::Refused,
                attempts: 2
            })
        );
        assert_eq!(started, vec![ms(0), ms(100)]);
        assert_eq!(told.len(), 1);
    }

    #[tokio::test(start_paused = true)]
    async fn pauses_stop_growing_at_the_cap() {
        let policy = RetryPolicy::new(6, ms(100)).capped_at(ms(300));
        let (_, started, _) = drive(policy, &[Err(Failure::Busy)]).await;
        // Pauses 100, 200, 300, 300, 300.
        assert_eq!(
            started,
            vec![ms(0), ms(100), ms(300), ms(600), ms(900), ms(1200)]
        );
        // A cap equal to the first pause is a fixed interval.
        let fixed = RetryPolicy::new(3, ms(3000)).capped_at(ms(3000));
        let (_, started, _) = drive(fixed, &[Err(Failure::Busy)]).await;
        assert_eq!(started, vec![ms(0), ms(3000), ms(6000)]);
    }

    #[tokio::test(start_paused = true)]
    async fn no_retry_starts_when_its_pause_would_end_past_the_deadline() {
        // Pauses 500 and 1000 fit in 2 s; the next (2000) would end past it.
        // It returns as the third attempt fails instead of sleeping towards the deadline.
        let policy = RetryPolicy::new(10, ms(500)).with_deadline(Duration::from_secs(2));
        assert_busy_until_exhausted(policy, 3, &[0, 500, 1500]).await;
    }

    #[tokio::test(start_paused = true)]
    async fn an_attempt_running_at_the_deadline_is_abandoned() {
        let policy = RetryPolicy::new(4, ms(100)).with_deadline(ms(700));
        let start = Instant::now();
        let result: Result<(), RetryError<Failure>> = policy
            .run(
                |_| true,
                |_| {},
                |_| async {
                    tokio::time::sleep(Duration::from_secs(30)).await;
                    Ok(())
                },
            )
            .await;
        assert_eq!(result, Err(RetryError::DeadlineExceeded { attempts: 1 }));
        assert_eq!(start.elapsed(), ms(700));
    }

    #[test]
    fn zero_attempts_means_one_and_huge_backoffs_saturate() {
        assert_eq!(RetryPolicy::new(0, ms(1)).max_attempts(), 1);
        let policy = RetryPolicy::new(100, Duration::from_secs(1));
        assert_eq!(policy.pause_after(1), Duration::from_secs(1));
        assert_eq!(policy.pause_after(3), Duration::from_secs(4));
        assert!(policy.pause_after(90) >= Duration::from_secs(1 << 31));
    }
}
