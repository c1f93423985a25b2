//! Relaying the bytes of an L4 connection: each direction moves on its
//! own until its source ends (then the other side's write half is shut,
//! so half-close reaches the peer) or either fails.
//!
//! Each direction starts by copying through a small buffer of its own.
//! On Linux, the first read that fills it marks the direction as bulk,
//! and from then on its bytes go through a pipe with `splice(2)`, never
//! entering this process's memory: socket → pipe → socket, the kernel
//! moving page references (HAProxy's `splice-auto`). Request-response
//! traffic never costs a pipe, and idle connections hold none. Where a
//! pipe cannot be had (not Linux, out of descriptors, or past the user's
//! pipe budget), the direction goes on copying.

use std::io;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use metrics::Counter;
use tokio::net::TcpStream;

/// What a relay has moved so far, and when it last moved anything;
/// shared with whoever watches it (idle timeout, access log).
pub struct Progress {
    started: Instant,
    /// Client to upstream, upstream to client.
    pub up: AtomicU64,
    pub down: AtomicU64,
    /// Milliseconds after `started` of the last move in either direction.
    last: AtomicU64,
}

impl Progress {
    pub fn new() -> Self {
        Self {
            started: Instant::now(),
            up: AtomicU64::new(0),
            down: AtomicU64::new(0),
            last: AtomicU64::new(0),
        }
    }

    pub fn moved(&self, way: &AtomicU64, n: usize) {
        way.fetch_add(n as u64, Ordering::Relaxed);
        let now = u64::try_from(self.started.elapsed().as_millis()).unwrap_or(u64::MAX);
        self.last.store(now, Ordering::Relaxed);
    }

    /// Completes once nothing moved either way for `idle`: a connection
    /// that is busy, even in one direction only, is never cut.
    pub async fn idle_for(&self, idle: Duration) {
        loop {
            let last = self.started + Duration::from_millis(self.last.load(Ordering::Relaxed));
            let deadline = last + idle;
            if Instant::now() >= deadline {
                return;
            }
            tokio::time::sleep_until(deadline.into()).await;
        }
    }
}

impl Default for Progress {
    fn default() -> Self {
        Self::new()
    }
}

/// The byte counters each direction feeds as it moves.
pub struct Meters<'a> {
    pub progress: &'a Progress,
    pub up: &'a Counter,
    pub down: &'a Counter,
}

/// Relays between `client` and `server` until both directions ended
/// (`Ok`), or either failed (the error); either way both are closed when
/// it returns (a reset, after a failure).
pub async fn relay(client: TcpStream, server: TcpStream, meters: Meters<'_>) -> io::Result<()> {
    let ended = AtomicBool::new(false);
    let up = one_way(
        &client,
        &server,
        &meters.progress.up,
        meters.up,
        meters.progress,
        &ended,
    );
    let down = one_way(
        &server,
        &client,
        &meters.progress.down,
        meters.down,
        meters.progress,
        &ended,
    );
    tokio::try_join!(up, down).map(|_| ())
}

/// Moves `src`'s bytes to `dst` until `src` ends, then half-closes `dst`
/// if the other direction goes on (`ended` is shared by both): the
/// second direction to end leaves it to the close that follows as
/// `relay` returns, a FIN all the same (the socket's bytes were all
/// read), one system call fewer per connection.
async fn one_way(
    src: &TcpStream,
    dst: &TcpStream,
    way: &AtomicU64,
    counter: &Counter,
    progress: &Progress,
    ended: &AtomicBool,
) -> io::Result<()> {
    let moved = |n: usize| {
        progress.moved(way, n);
        counter.increment(n as u64);
    };
    let splice = cfg!(target_os = "linux");
    // Not zeroed: reads write only into the spare capacity.
    let mut buffer = Vec::with_capacity(BUFFER);
    if copy(src, dst, &moved, &mut buffer, splice).await? == Copied::Bulk {
        #[cfg(target_os = "linux")]
        match splice::Pipe::new() {
            Ok(pipe) => {
                drop(buffer);
                pipe.relay(src, dst, &moved).await?;
            }
            Err(error) => {
                tracing::debug!(%error, "no pipe for splice; copying through a buffer");
                copy(src, dst, &moved, &mut buffer, false).await?;
            }
        }
    }
    if ended.swap(true, Ordering::AcqRel) {
        Ok(())
    } else {
        shutdown_write(dst)
    }
}

/// A direction's buffer: tokio's `copy_bidirectional`'s size.
const BUFFER: usize = 8 * 1024;

#[derive(Debug, PartialEq, Eq)]
enum Copied {
    /// `src` ended.
    Ended,
    /// A read filled the buffer, and `until_bulk` was asked.
    Bulk,
}

/// Moves `src`'s bytes to `dst` through `buffer` (its capacity; it is
/// left empty) until `src` ends, or (with `until_bulk`) until a read
/// fills the buffer.
async fn copy(
    src: &TcpStream,
    dst: &TcpStream,
    moved: impl Fn(usize),
    buffer: &mut Vec<u8>,
    until_bulk: bool,
) -> io::Result<Copied> {
    loop {
        buffer.clear();
        src.readable().await?;
        let n = match read_some(src, buffer) {
            Ok(0) => return Ok(Copied::Ended),
            Ok(n) => n,
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => continue,
            Err(e) => return Err(e),
        };
        let mut written = 0;
        while written < n {
            dst.writable().await?;
            match dst.try_write(&buffer[written..n]) {
                Ok(m) => written += m,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => continue,
                Err(e) => return Err(e),
            }
        }
        moved(n);
        if until_bulk && n == buffer.capacity() {
            return Ok(Copied::Bulk);
        }
    }
}

/// Reads what `src` has into `buffer`'s spare capacity (`Ok(0)`: it
/// ended). A read that leaves room took everything the socket held, so
/// its readiness is cleared at once (tokio clears it on `WouldBlock`)
/// rather than by one more read that would find nothing: one system
/// call fewer per message, as HAProxy does. Bytes arriving later raise a
/// new event; an end of stream already seen stays ready.
fn read_some(src: &TcpStream, buffer: &mut Vec<u8>) -> io::Result<usize> {
    let mut drained = 0;
    let read = src.try_io(tokio::io::Interest::READABLE, || {
        let room = buffer.capacity() - buffer.len();
        let (n, _) = rustix::net::recv(
            src,
            rustix::buffer::spare_capacity(buffer),
            rustix::net::RecvFlags::empty(),
        )?;
        if n > 0 && n < room {
            drained = n;
            return Err(io::ErrorKind::WouldBlock.into());
        }
        Ok(n)
    });
    match read {
        Err(e) if e.kind() == io::ErrorKind::WouldBlock && drained > 0 => Ok(drained),
        read => read,
    }
}

/// Half-closes `stream`: the peer reads EOF, and can still send.
fn shutdown_write(stream: &TcpStream) -> io::Result<()> {
    match rustix::net::shutdown(stream, rustix::net::Shutdown::Write) {
        Ok(()) => Ok(()),
        // The peer is already gone: nothing left to tell it.
        Err(rustix::io::Errno::NOTCONN) => Ok(()),
        Err(errno) => Err(errno.into()),
    }
}

#[cfg(target_os = "linux")]
mod splice {
    use std::io;
    use std::os::fd::{AsFd, OwnedFd};

    use rustix::pipe::{pipe_with, splice, PipeFlags, SpliceFlags};
    use tokio::io::Interest;
    use tokio::net::TcpStream;

    /// A pipe of one direction of one connection.
    pub struct Pipe {
        read: OwnedFd,
        write: OwnedFd,
        /// How much one splice moves at most: the pipe's capacity, so
        /// that filling an empty pipe never waits on the pipe.
        capacity: usize,
    }

    /// A pipe's capacity when it is made (Linux's default).
    const DEFAULT_CAPACITY: usize = 16 * 4096;
    /// What a pipe is grown to when Linux allows: a quarter of the
    /// wake-ups and splices per megabyte.
    const WANTED_CAPACITY: usize = 256 * 1024;

    impl Pipe {
        /// A pipe for one direction; an error when Linux gives no pipe, or
        /// only a small one: an unprivileged process past
        /// `fs.pipe-user-pages-soft` gets two-page pipes, slower than
        /// copying, so the direction copies instead (HAProxy's `maxpipes`
        /// fallback, found rather than configured).
        pub fn new() -> io::Result<Self> {
            let (read, write) = pipe_with(PipeFlags::CLOEXEC | PipeFlags::NONBLOCK)?;
            let made = rustix::pipe::fcntl_getpipe_size(&write)?;
            if made < DEFAULT_CAPACITY {
                return Err(io::Error::other(format!(
                    "pipes are limited to {made} bytes (fs.pipe-user-pages-soft)"
                )));
            }
            let capacity =
                rustix::pipe::fcntl_setpipe_size(&write, WANTED_CAPACITY).unwrap_or(made);
            Ok(Self {
                read,
                write,
                capacity,
            })
        }

        /// Socket → pipe → socket until `src` ends. Each round fills the
        /// empty pipe from `src`, then drains it into `dst`: so an EAGAIN
        /// from the first splice means `src` has nothing, and from the
        /// second that `dst` cannot take more, never that the pipe is
        /// full or empty; each clears the readiness of the socket it
        /// names, as tokio requires.
        pub async fn relay(
            &self,
            src: &TcpStream,
            dst: &TcpStream,
            moved: impl Fn(usize),
        ) -> io::Result<()> {
            let flags = SpliceFlags::NONBLOCK | SpliceFlags::MOVE;
            loop {
                let n = loop {
                    src.readable().await?;
                    let filled = src.try_io(Interest::READABLE, || {
                        splice(src.as_fd(), None, &self.write, None, self.capacity, flags)
                            .map_err(io::Error::from)
                    });
                    match filled {
                        Ok(n) => break n,
                        Err(e) if e.kind() == io::ErrorKind::WouldBlock => continue,
                        Err(e) => return Err(e),
                    }
                };
                if n == 0 {
                    return Ok(());
                }
                let mut left = n;
                while left > 0 {
                    dst.writable().await?;
                    let drained = dst.try_io(Interest::WRITABLE, || {
                        splice(&self.read, None, dst.as_fd(), None, left, flags)
                            .map_err(io::Error::from)
                    });
                    match drained {
                        Ok(m) => left -= m,
                        Err(e) if e.kind() == io::ErrorKind::WouldBlock => continue,
                        Err(e) => return Err(e),
                    }
                }
                moved(n);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    async fn pair() -> (TcpStream, TcpStream) {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind");
        let addr = listener.local_addr().expect("addr");
        let (a, b) = tokio::join!(TcpStream::connect(addr), listener.accept());
        (a.expect("connect"), b.expect("accept").0)
    }

    #[tokio::test]
    async fn relays_both_ways_counts_bytes_and_passes_half_close_on() {
        // client_end <-> [client | relay | server] <-> server_end
        let (mut client_end, client) = pair().await;
        let (server, mut server_end) = pair().await;
        let progress = Progress::new();
        let (up, down) = (Counter::noop(), Counter::noop());
        let relaying = async {
            relay(
                client,
                server,
                Meters {
                    progress: &progress,
                    up: &up,
                    down: &down,
                },
            )
            .await
        };
        let talking = async {
            // 3 MiB up, then half-close; the server still answers.
            let payload: Vec<u8> = (0..3 * 1024 * 1024).map(|i| (i % 251) as u8).collect();
            let sending = async {
                client_end.write_all(&payload).await.expect("write");
                client_end.shutdown().await.expect("half-close");
            };
            let mut received = Vec::new();
            let receiving = async {
                server_end.read_to_end(&mut received).await.expect("read");
            };
            tokio::join!(sending, receiving);
            assert_eq!(received, payload, "every byte, in order, then EOF");
            server_end
                .write_all(b"after half-close")
                .await
                .expect("answer");
            server_end.shutdown().await.expect("close");
            let mut answer = Vec::new();
            client_end
                .read_to_end(&mut answer)
                .await
                .expect("read answer");
            assert_eq!(answer, b"after half-close");
        };
        let (relayed, ()) = tokio::join!(relaying, talking);
        relayed.expect("relay ends cleanly");
        assert_eq!(progress.up.load(Ordering::Relaxed), 3 * 1024 * 1024);
        assert_eq!(progress.down.load(Ordering::Relaxed), 16);
    }

    #[tokio::test]
    async fn small_messages_back_and_forth_are_never_left_unread() {
        // Each short read clears the socket's readiness without a second
        // read: a message that arrived meanwhile must still be seen.
        let (mut client_end, client) = pair().await;
        let (server, mut server_end) = pair().await;
        // Without Nagle's algorithm, each write goes out as it is made.
        for socket in [&client_end, &client, &server, &server_end] {
            socket.set_nodelay(true).expect("nodelay");
        }
        let progress = Progress::new();
        let (up, down) = (Counter::noop(), Counter::noop());
        let meters = Meters {
            progress: &progress,
            up: &up,
            down: &down,
        };
        let talking = async {
            let mut reply = [0u8; 64];
            for round in 0..500u32 {
                let ask = format!("ask {round}");
                client_end.write_all(ask.as_bytes()).await.expect("ask");
                let n = server_end.read(&mut reply).await.expect("server reads");
                assert_eq!(&reply[..n], ask.as_bytes());
                // Two writes in a row: they may arrive as one read or two.
                server_end.write_all(b"an").await.expect("answer");
                server_end.write_all(b"swer").await.expect("answer");
                let mut got = Vec::new();
                while got.len() < 6 {
                    let n = client_end.read(&mut reply).await.expect("client reads");
                    assert!(n > 0, "closed early in round {round}");
                    got.extend_from_slice(&reply[..n]);
                }
                assert_eq!(got, b"answer");
            }
            drop((client_end, server_end));
        };
        let run = async { tokio::join!(relay(client, server, meters), talking).0 };
        tokio::time::timeout(Duration::from_secs(20), run)
            .await
            .expect("no message is left waiting")
            .expect("relay ends cleanly");
        assert_eq!(progress.down.load(Ordering::Relaxed), 500 * 6);
    }

    #[tokio::test]
    async fn idle_for_waits_for_a_quiet_spell_not_for_the_first_byte() {
        let progress = Progress::new();
        let started = Instant::now();
        let idle = Duration::from_millis(200);
        let mover = async {
            for _ in 0..5 {
                tokio::time::sleep(Duration::from_millis(100)).await;
                progress.moved(&progress.up, 1);
            }
        };
        tokio::join!(progress.idle_for(idle), mover);
        // Moving every 100 ms for 500 ms, then 200 ms of quiet.
        assert!(
            started.elapsed() >= Duration::from_millis(650),
            "{:?}",
            started.elapsed()
        );
    }
}
