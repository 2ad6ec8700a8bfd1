//! A micro-batcher: callers hand one request each to a task of its own and
//! await their answer; the task serves the requests waiting at that moment
//! together, in one batch. What the publishes of one claim read
//! ([`loader`](super::loader)) then costs a round trip, and a transaction,
//! per batch instead of one per job.
//!
//! The task takes every request waiting when it wakes, up to
//! [`Batch::MAX_BATCH`], and keeps taking until [`QUIET_TURNS`] turns in a
//! row it yields to the runtime bring none (or [`GATHER_TURNS`] in all): the
//! jobs of one claim start
//! together but reach the inbox over a few turns, on both of the runtime's
//! threads, and a batch closed at the first would split the claim into
//! several reads. Requests arriving later form the next batch. At most
//! [`Batch::MAX_IN_FLIGHT`] batches run at once, so a slow database makes
//! batches larger rather than taking every pooled connection.

use std::fmt;
use std::future::Future;
use std::sync::{Arc, OnceLock};

use tokio::sync::{Semaphore, mpsc, oneshot};

/// What one batch does with its requests.
pub trait Batch: Send + Sync + 'static {
    type Request: Send + 'static;
    type Answer: Send + 'static;
    /// Most requests in one batch.
    const MAX_BATCH: usize;
    /// Most batches served at once.
    const MAX_IN_FLIGHT: usize;

    /// Serves `requests`: one answer each, in their order (a request left
    /// without one hears [`Lost::Dropped`]).
    fn serve(&self, requests: Vec<Self::Request>)
    -> impl Future<Output = Vec<Self::Answer>> + Send;
}

/// Why a request got no answer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Lost {
    /// The batcher's task has ended.
    Stopped,
    /// The batch dropped the request unanswered.
    Dropped,
}

/// Most turns a batch waits for more of its claim's requests.
pub const GATHER_TURNS: usize = 32;

/// Turns in a row that bring no request close a batch: one quiet turn split
/// a claim's jobs, which reach the inbox from both of the runtime's threads
/// and between their own awaits, into batches of a third of the claim (1,107
/// reads for 20,000 publishes claimed 48 at a time); a lone request waits
/// two yields more.
pub const QUIET_TURNS: usize = 3;

type Waiting<B> = (<B as Batch>::Request, oneshot::Sender<<B as Batch>::Answer>);

/// Serves requests in batches. Cloning shares the batcher.
pub struct MicroBatcher<B: Batch> {
    batch: Arc<B>,
    /// The task's inbox, made on first use: that is inside the relay's
    /// runtime, which making the worker need not be.
    inbox: Arc<OnceLock<mpsc::UnboundedSender<Waiting<B>>>>,
}

impl<B: Batch> Clone for MicroBatcher<B> {
    fn clone(&self) -> Self {
        MicroBatcher {
            batch: Arc::clone(&self.batch),
            inbox: Arc::clone(&self.inbox),
        }
    }
}

impl<B: Batch + fmt::Debug> fmt::Debug for MicroBatcher<B> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("MicroBatcher")
            .field("batch", &self.batch)
            .finish_non_exhaustive()
    }
}

impl<B: Batch> MicroBatcher<B> {
    pub fn new(batch: B) -> MicroBatcher<B> {
        MicroBatcher {
            batch: Arc::new(batch),
            inbox: Arc::default(),
        }
    }

    /// `request`'s answer, served with the other requests waiting now.
    pub async fn ask(&self, request: B::Request) -> Result<B::Answer, Lost> {
        let (reply, answer) = oneshot::channel();
        self.inbox()
            .send((request, reply))
            .map_err(|_| Lost::Stopped)?;
        answer.await.map_err(|_| Lost::Dropped)
    }

    /// Sends `requests` at once, so that one batch serves them (up to
    /// [`Batch::MAX_BATCH`] a batch), without waiting: each answer comes on
    /// its own receiver, which errs if the request is lost.
    pub fn ask_all(&self, requests: Vec<B::Request>) -> Vec<oneshot::Receiver<B::Answer>> {
        let inbox = self.inbox();
        requests
            .into_iter()
            .map(|request| {
                let (reply, answer) = oneshot::channel();
                // Refused only once the task has ended: the receiver then
                // errs, its sender dropped with the request.
                let _ = inbox.send((request, reply));
                answer
            })
            .collect()
    }

    /// The task's inbox, starting the task on first use.
    fn inbox(&self) -> &mpsc::UnboundedSender<Waiting<B>> {
        self.inbox.get_or_init(|| {
            let (sender, receiver) = mpsc::unbounded_channel();
            tokio::spawn(run(Arc::clone(&self.batch), receiver));
            sender
        })
    }
}

/// Serves batches until every [`MicroBatcher`] sharing the inbox is gone.
async fn run<B: Batch>(batch: Arc<B>, mut inbox: mpsc::UnboundedReceiver<Waiting<B>>) {
    let in_flight = Arc::new(Semaphore::new(B::MAX_IN_FLIGHT));
    while let Some(first) = inbox.recv().await {
        let Ok(permit) = Arc::clone(&in_flight).acquire_owned().await else {
            return;
        };
        // The other jobs of a claim were started with this one: let them
        // reach the inbox before the batch is closed.
        let mut waiting = vec![first];
        let mut quiet = 0;
        for _ in 0..GATHER_TURNS {
            tokio::task::yield_now().await;
            let before = waiting.len();
            while waiting.len() < B::MAX_BATCH {
                match inbox.try_recv() {
                    Ok(next) => waiting.push(next),
                    Err(_) => break,
                }
            }
            if waiting.len() == B::MAX_BATCH {
                break;
            }
            quiet = if waiting.len() == before {
                quiet + 1
            } else {
                0
            };
            if quiet == QUIET_TURNS {
                break;
            }
        }
        let batch = Arc::clone(&batch);
        tokio::spawn(async move {
            let (requests, replies): (Vec<_>, Vec<_>) = waiting.into_iter().unzip();
            let answers = batch.serve(requests).await;
            for (reply, answer) in replies.into_iter().zip(answers) {
                // The job may have been cancelled meanwhile: nobody to tell.
                let _ = reply.send(answer);
            }
            drop(permit);
        });
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Mutex;

    use super::*;

    /// Doubles each number, and remembers the size of each batch.
    #[derive(Debug, Default)]
    struct Doubler {
        sizes: Mutex<Vec<usize>>,
    }

    impl Batch for Doubler {
        type Request = u32;
        type Answer = u32;
        const MAX_BATCH: usize = 4;
        const MAX_IN_FLIGHT: usize = 1;

        async fn serve(&self, requests: Vec<u32>) -> Vec<u32> {
            self.sizes
                .lock()
                .expect("not poisoned")
                .push(requests.len());
            requests.into_iter().map(|n| n * 2).collect()
        }
    }

    #[tokio::test]
    async fn requests_asked_together_are_served_together_up_to_the_batch_size() {
        let batcher = MicroBatcher::new(Doubler::default());
        let asks = (0..10).map(|n| {
            let batcher = batcher.clone();
            tokio::spawn(async move { batcher.ask(n).await })
        });
        let mut answers = Vec::new();
        for ask in asks.collect::<Vec<_>>() {
            answers.push(ask.await.expect("joined").expect("answered"));
        }
        assert_eq!(answers, (0..10).map(|n| n * 2).collect::<Vec<_>>());
        let sizes = batcher.batch.sizes.lock().expect("not poisoned").clone();
        assert_eq!(sizes.iter().sum::<usize>(), 10);
        assert!(
            sizes.iter().all(|size| *size <= Doubler::MAX_BATCH),
            "{sizes:?}"
        );
        assert!(sizes.len() < 10, "some requests shared a batch: {sizes:?}");
    }

    #[tokio::test]
    async fn requests_sent_all_at_once_are_served_in_one_batch() {
        let batcher = MicroBatcher::new(Doubler::default());
        let answers = batcher.ask_all(vec![1, 2, 3]);
        let mut got = Vec::new();
        for answer in answers {
            got.push(answer.await.expect("answered"));
        }
        assert_eq!(got, vec![2, 4, 6]);
        let sizes = batcher.batch.sizes.lock().expect("not poisoned").clone();
        assert_eq!(sizes, vec![3]);
    }

    /// Answers none of its requests.
    #[derive(Debug)]
    struct Silent;

    impl Batch for Silent {
        type Request = ();
        type Answer = ();
        const MAX_BATCH: usize = 8;
        const MAX_IN_FLIGHT: usize = 1;

        async fn serve(&self, _requests: Vec<()>) -> Vec<()> {
            Vec::new()
        }
    }

    #[tokio::test]
    async fn a_request_the_batch_leaves_unanswered_is_told_so() {
        let batcher = MicroBatcher::new(Silent);
        assert_eq!(batcher.ask(()).await, Err(Lost::Dropped));
    }
}
