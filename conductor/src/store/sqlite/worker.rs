//! The store's own thread: every call runs there, one at a time, in the order sent.
//!
//! rusqlite blocks. On tokio's blocking pool each waiting call parked a thread on the
//! connection's mutex: at 1,000 nodes the conductor ran 464–515 threads, and long blocking work
//! elsewhere (an iSCSI write, a qcow2 conversion) could hold every pool thread while a store call
//! waited behind it. One thread of the store's own, fed through a channel, keeps the thread count
//! flat and the store independent of the pool; callers wait asynchronously for their answer.

use std::panic::AssertUnwindSafe;
use std::sync::{mpsc, Arc, Mutex, PoisonError};

use rusqlite::Connection;
use tokio::task::JoinHandle;

use crate::store::StoreError;

type Job = Box<dyn FnOnce(&mut Connection) + Send>;

/// The sending side of the store's thread; the thread ends when every clone is dropped.
#[derive(Debug, Clone)]
pub(super) struct Worker {
    jobs: mpsc::Sender<Job>,
}

impl Worker {
    /// Starts the thread, which takes `conn`'s lock for each call.
    pub(super) fn start(conn: Arc<Mutex<Connection>>) -> Result<Worker, StoreError> {
        let (jobs, queue) = mpsc::channel::<Job>();
        std::thread::Builder::new()
            .name("vmdeploy-sqlite".into())
            .spawn(move || {
                for job in queue {
                    // A poisoned lock means an earlier call panicked; its transaction was rolled
                    // back when it unwound, so the connection is still good to use.
                    let mut guard = conn.lock().unwrap_or_else(PoisonError::into_inner);
                    // A call that panics loses its answer (its caller sees the failure), not
                    // the thread.
                    let _ = std::panic::catch_unwind(AssertUnwindSafe(|| job(&mut guard)));
                }
            })
            .map_err(|e| StoreError::Database(format!("starting the database thread: {e}")))?;
        Ok(Worker { jobs })
    }

    /// Queues `f`; the returned task resolves to its answer. `f` runs to its end even when
    /// nobody waits for the answer any more: a transaction is never cut in half.
    pub(super) fn spawn<T, F>(&self, f: F) -> JoinHandle<Result<T, StoreError>>
    where
        T: Send + 'static,
        F: FnOnce(&mut Connection) -> Result<T, StoreError> + Send + 'static,
    {
        let (answer, answered) = tokio::sync::oneshot::channel();
        let job: Job = Box::new(move |conn| {
            let _ = answer.send(f(conn));
        });
        let queued = self.jobs.send(job).is_ok();
        tokio::spawn(async move {
            if !queued {
                return Err(StoreError::Database(
                    "the database thread has stopped".into(),
                ));
            }
            answered.await.unwrap_or_else(|_| {
                Err(StoreError::Database(
                    "the database call failed without an answer (it panicked)".into(),
                ))
            })
        })
    }
}
