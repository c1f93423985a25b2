//! Data-plane threads: one current-thread tokio runtime per core.
//!
//! Each worker accepts on its own listening sockets (one per worker and
//! listener, `SO_REUSEPORT`: the kernel spreads new connections over
//! them; see `listener`) and serves what it accepted to the end: the
//! client's requests, their upstream exchanges on connections from that
//! worker's share of each backend's pool, their timers. A connection
//! never changes thread and a request never wakes another one; in the
//! shared multi-thread runtime about a fifth of the CPU went to waking
//! the other worker (`sock_def_readable`, `finish_task_switch`), and
//! accepting on the control runtime and handing each connection over
//! cost an epoll deregistration, a registration and a cross-thread
//! wake-up per connection.
//!
//! What stays shared: the one `ArcSwap` of the active generation, backend
//! state (in-flight counts, health, outlier state), counters. hyper's
//! pooled client (TLS, h2 and h2c backends) is one per worker and backend
//! as well: a connection's task runs on the worker that opened it, so a
//! shared one woke another thread for half of the requests.

use std::future::Future;
use std::pin::Pin;

use tokio::sync::mpsc;

/// Work handed to a worker: made into a future on the worker's thread,
/// so that the sockets it opens register with that worker's reactor.
pub type Job = Box<dyn FnOnce() -> Pin<Box<dyn Future<Output = ()> + Send>> + Send>;

pub struct Workers {
    queues: Vec<mpsc::UnboundedSender<Job>>,
}

impl std::fmt::Debug for Workers {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Workers")
            .field("threads", &self.queues.len())
            .finish()
    }
}

impl Workers {
    /// Starts `threads` workers (at least one).
    pub fn start(threads: usize) -> std::io::Result<Workers> {
        let threads = threads.max(1);
        crate::backends::set_shards(threads);
        let mut queues = Vec::with_capacity(threads);
        for index in 0..threads {
            let (queue, mut jobs) = mpsc::unbounded_channel::<Job>();
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()?;
            std::thread::Builder::new()
                .name(format!("cutover-worker-{index}"))
                .spawn(move || {
                    crate::backends::enter_shard(index);
                    runtime.block_on(async move {
                        while let Some(job) = jobs.recv().await {
                            tokio::spawn(job());
                        }
                    });
                })?;
            queues.push(queue);
        }
        Ok(Workers { queues })
    }

    pub fn threads(&self) -> usize {
        self.queues.len()
    }

    /// Hands `job` to worker `index` (modulo the number of workers).
    pub fn spawn_on(&self, index: usize, job: Job) {
        let Some(queue) = self.queues.get(index % self.queues.len().max(1)) else {
            return;
        };
        if let Err(mpsc::error::SendError(job)) = queue.send(job) {
            // The worker is gone (only at exit): serve it here.
            tokio::spawn(job());
        }
    }
}
