//! Tunnels: an HTTP/1.1 connection after a protocol switch (a WebSocket,
//! or any other `Upgrade`), relayed to its backend until either side
//! closes.
//!
//! A tunnel is open work: drain waits for it like for a request, until
//! `drain_timeout`. When the deadline passes it ends as its protocol
//! allows. A WebSocket is closed as a server going away would close it,
//! at frame boundaries: the backend gets a close 1001 after the client's
//! last whole frame; what the backend sends until its close reply still
//! reaches the client (an answer to the client's last message among it),
//! then the client gets a close 1001 and each side a FIN once its own
//! close has come back (or `CLOSE_GRACE` passed). Any other tunnel gets a
//! FIN both ways. Either way its access-log line says `drain_timeout`.

use std::io;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::sync::watch;

use super::conn::OpenHold;
use crate::telemetry::access::{Flags, Trail};

/// How long a WebSocket closed at the drain deadline has to finish its
/// closing handshake (a frame under way, each side's close reply).
pub const CLOSE_GRACE: Duration = Duration::from_secs(2);

/// How long the client's close frame may take to write.
const CLOSE_WRITE: Duration = Duration::from_millis(500);

/// WebSocket close code 1001, "going away" (RFC 6455 §7.4.1).
const GOING_AWAY: [u8; 2] = 1001u16.to_be_bytes();

/// An upgraded connection spliced to its backend.
pub(super) struct Tunnel {
    pub pinned: crate::generation::InflightGuard,
    pub backend: crate::backends::BackendGuard,
    pub route: Option<crate::generation::RouteSlot>,
    pub store: Arc<crate::runtime::GenerationStore>,
    /// Holds the request's access-log line (`handle` leaves it there for
    /// a 101) until the tunnel closes.
    pub trail: Option<Arc<Trail>>,
    /// Counted as open work, and as work the deadline ends, until it
    /// closes.
    pub hold: (OpenHold, OpenHold),
    /// The drain deadline.
    pub cut: watch::Receiver<bool>,
    /// `Upgrade: websocket`: framed, closed with 1001 at the deadline.
    pub websocket: bool,
}

impl Tunnel {
    pub async fn run(
        self,
        downstream: hyper::upgrade::OnUpgrade,
        upstream: hyper::upgrade::OnUpgrade,
        listener: Arc<str>,
    ) {
        let joined = tokio::join!(downstream, upstream);
        // The 101 has been sent by now, so `handle` has left the line in
        // the trail: it is taken out on every path (the line holds the
        // trail too), and written when it drops.
        let mut line = self.trail.as_ref().and_then(|t| t.take_deferred());
        let (downstream, upstream) = match joined {
            (Ok(d), Ok(u)) => (d, u),
            (Err(error), _) | (_, Err(error)) => {
                tracing::debug!(listener = %listener, %error, "protocol switch did not complete");
                return;
            }
        };
        let client = hyper_util::rt::TokioIo::new(downstream);
        let server = hyper_util::rt::TokioIo::new(upstream);
        let generation = self.pinned.ledger().generation();
        let moved = Moved::default();
        let relayed = relay(client, server, self.websocket, &moved, self.cut.clone());
        let flags = tokio::select! {
            relayed = relayed => match relayed {
                Ok(Ended::Closed) => Flags::NONE,
                Ok(Ended::AtDeadline) => {
                    tracing::info!(listener = %listener, websocket = self.websocket, "closed an upgraded connection still open at the drain deadline");
                    Flags::DRAIN_TIMEOUT
                }
                Err(_) => Flags::UPSTREAM_RESET,
            },
            _ = super::conn::pinned_age_expired(&self.store, generation) => {
                tracing::info!(listener = %listener, %generation, "closing an upgraded connection pinned past max_pinned_age");
                Flags::NONE
            }
        };
        // The line covers the whole session: its bytes each way, and its
        // duration to the close.
        if let Some(line) = line.as_mut() {
            line.tunnelled(
                moved.up.load(Ordering::Relaxed),
                moved.down.load(Ordering::Relaxed),
                flags,
            );
        }
        drop((line, self.pinned, self.backend, self.route, self.hold));
    }
}

/// Bytes moved each way: client to backend, backend to client.
#[derive(Default)]
struct Moved {
    up: AtomicU64,
    down: AtomicU64,
}

#[derive(Debug, PartialEq, Eq)]
enum Ended {
    /// Both sides closed.
    Closed,
    /// Ended at the drain deadline.
    AtDeadline,
}

/// Which way bytes go; a WebSocket is closed differently on each side.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Way {
    /// Client to backend: frames are masked.
    Up,
    /// Backend to client.
    Down,
}

/// Relays both ways until both sides closed, or the drain deadline
/// (`cut`) has passed and the tunnel was ended.
async fn relay<C, S>(
    client: C,
    server: S,
    websocket: bool,
    moved: &Moved,
    cut: watch::Receiver<bool>,
) -> io::Result<Ended>
where
    C: AsyncRead + AsyncWrite + Unpin,
    S: AsyncRead + AsyncWrite + Unpin,
{
    let (mut client_read, mut client_write) = tokio::io::split(client);
    let (mut server_read, mut server_write) = tokio::io::split(server);
    let up = one_way(
        &mut client_read,
        &mut server_write,
        Way::Up,
        websocket,
        &moved.up,
        cut.clone(),
    );
    let down = one_way(
        &mut server_read,
        &mut client_write,
        Way::Down,
        websocket,
        &moved.down,
        cut,
    );
    let (up, down) = tokio::try_join!(up, down)?;
    Ok(if up == Ended::AtDeadline || down == Ended::AtDeadline {
        Ended::AtDeadline
    } else {
        Ended::Closed
    })
}

const CHUNK: usize = 16 * 1024;

/// One direction: copies until its source ends (then shuts the other
/// side's write half), or until the drain deadline; then a WebSocket's
/// direction is closed (`close_websocket`, and the client's 1001), and
/// the other side's write half is shut.
async fn one_way<R, W>(
    from: &mut R,
    to: &mut W,
    way: Way,
    websocket: bool,
    moved: &AtomicU64,
    mut cut: watch::Receiver<bool>,
) -> io::Result<Ended>
where
    R: AsyncRead + Unpin,
    W: AsyncWrite + Unpin,
{
    let mut frames = Frames::default();
    let mut buf = vec![0u8; CHUNK];
    loop {
        // Reading is cancel-safe (nothing is lost when the deadline wins);
        // a write always completes.
        let n = tokio::select! {
            biased;
            Ok(_) = cut.wait_for(|cut| *cut) => break,
            n = from.read(&mut buf) => n?,
        };
        if n == 0 {
            to.shutdown().await?;
            return Ok(Ended::Closed);
        }
        let chunk = buf.get(..n).unwrap_or_default();
        if websocket {
            frames.track(chunk);
        }
        to.write_all(chunk).await?;
        moved.fetch_add(n as u64, Ordering::Relaxed);
    }
    if websocket {
        let closing = close_websocket(from, to, way, &mut frames, moved);
        // Past the grace the closing handshake is given up.
        let _ = tokio::time::timeout(CLOSE_GRACE, closing).await;
        // The client hears 1001 when its stream is between frames (the
        // backend's own close is never passed on): after the backend's
        // close, or when the backend did not send one in time.
        if way == Way::Down && (frames.at_boundary() || frames.closing()) {
            let frame = close_frame(false);
            let _ = tokio::time::timeout(CLOSE_WRITE, to.write_all(&frame)).await;
        }
    }
    let _ = to.shutdown().await;
    Ok(Ended::AtDeadline)
}

/// Ends one direction of a WebSocket at the drain deadline (see the
/// module's text).
async fn close_websocket<R, W>(
    from: &mut R,
    to: &mut W,
    way: Way,
    frames: &mut Frames,
    moved: &AtomicU64,
) -> io::Result<()>
where
    R: AsyncRead + Unpin,
    W: AsyncWrite + Unpin,
{
    let mut buf = vec![0u8; CHUNK];
    match way {
        Way::Up => close_up(from, to, &mut buf, frames, moved).await,
        Way::Down => close_down(from, to, &mut buf, frames, moved).await,
    }
}

/// Client to backend: what the client has sent by now goes on, the frame
/// under way whole; then the backend hears that the gateway is going
/// away, and the client's own close ends it.
async fn close_up<R, W>(
    from: &mut R,
    to: &mut W,
    buf: &mut [u8],
    frames: &mut Frames,
    moved: &AtomicU64,
) -> io::Result<()>
where
    R: AsyncRead + Unpin,
    W: AsyncWrite + Unpin,
{
    loop {
        let n = if frames.at_boundary() {
            // Only what is there already (a zero timeout polls once).
            match tokio::time::timeout(Duration::ZERO, from.read(buf)).await {
                Ok(n) => n?,
                Err(_) => break,
            }
        } else {
            from.read(buf).await?
        };
        if n == 0 {
            return Ok(());
        }
        let chunk = buf.get(..n).unwrap_or_default();
        frames.track(chunk);
        to.write_all(chunk).await?;
        moved.fetch_add(n as u64, Ordering::Relaxed);
    }
    to.write_all(&close_frame(true)).await?;
    to.flush().await?;
    // The client's own close (its reply to the one it gets from
    // the other direction) ends it; what it sends before is
    // too late for a backend that is closing.
    let mut frames = Frames::default();
    loop {
        let n = from.read(buf).await?;
        if n == 0 {
            return Ok(());
        }
        let mut rest = buf.get(..n).unwrap_or_default();
        while !rest.is_empty() {
            let step = frames.step(rest);
            rest = rest.get(step.used..).unwrap_or_default();
            if step.ended && step.opcode == Some(OPCODE_CLOSE) {
                return Ok(());
            }
        }
    }
}

/// Backend to client: what the backend sends until its close reply still
/// goes to the client (the answer to the client's last message may be
/// among it); its close is not passed on (`one_way` sends the client its
/// own 1001).
async fn close_down<R, W>(
    from: &mut R,
    to: &mut W,
    buf: &mut [u8],
    frames: &mut Frames,
    moved: &AtomicU64,
) -> io::Result<()>
where
    R: AsyncRead + Unpin,
    W: AsyncWrite + Unpin,
{
    let mut held = Vec::new();
    'frames: loop {
        let n = from.read(buf).await?;
        if n == 0 {
            break;
        }
        let mut rest = buf.get(..n).unwrap_or_default();
        while !rest.is_empty() {
            let step = frames.step(rest);
            let (part, after) = rest.split_at(step.used.min(rest.len()));
            rest = after;
            match step.opcode {
                Some(OPCODE_CLOSE) if step.ended => break 'frames,
                Some(OPCODE_CLOSE) => {}
                Some(_) => {
                    held.extend_from_slice(part);
                    to.write_all(&held).await?;
                    moved.fetch_add(held.len() as u64, Ordering::Relaxed);
                    held.clear();
                }
                // A frame head not whole yet.
                None => held.extend_from_slice(part),
            }
        }
    }
    Ok(())
}

const OPCODE_CLOSE: u8 = 0x8;

/// A close frame with code 1001; `masked` for the backend (a client's
/// frames are masked, RFC 6455 §5.3).
fn close_frame(masked: bool) -> Vec<u8> {
    let mut frame = vec![0x80 | OPCODE_CLOSE];
    if masked {
        let mut key = [0u8; 4];
        let _ = ring::rand::SecureRandom::fill(&ring::rand::SystemRandom::new(), &mut key);
        frame.push(0x80 | GOING_AWAY.len() as u8);
        frame.extend_from_slice(&key);
        frame.extend(GOING_AWAY.iter().zip(key).map(|(byte, mask)| byte ^ mask));
    } else {
        frame.push(GOING_AWAY.len() as u8);
        frame.extend_from_slice(&GOING_AWAY);
    }
    frame
}

/// Where a WebSocket byte stream is: in a frame's head, or how much of
/// its payload is left (RFC 6455 §5.2). Only lengths are read; payloads
/// pass untouched.
#[derive(Debug, Default)]
struct Frames {
    head: [u8; 14],
    /// Bytes of the head read so far (while not in a payload).
    have: usize,
    /// In a payload: its opcode and how much of it is left.
    payload: Option<(u8, u64)>,
}

/// What one `Frames::step` went through.
struct Step {
    used: usize,
    /// The frame's opcode, once its head is whole.
    opcode: Option<u8>,
    /// The frame ended with these bytes.
    ended: bool,
}

impl Frames {
    fn at_boundary(&self) -> bool {
        self.payload.is_none() && self.have == 0
    }

    /// In a close frame's payload.
    fn closing(&self) -> bool {
        matches!(self.payload, Some((OPCODE_CLOSE, _)))
    }

    /// The head's length, as far as its first bytes tell.
    fn head_len(&self) -> usize {
        if self.have < 2 {
            return 2;
        }
        let extended = match self.head[1] & 0x7f {
            126 => 2,
            127 => 8,
            _ => 0,
        };
        let mask = if self.head[1] & 0x80 != 0 { 4 } else { 0 };
        2 + extended + mask
    }

    fn payload_len(&self) -> u64 {
        match self.head[1] & 0x7f {
            126 => u64::from(u16::from_be_bytes([self.head[2], self.head[3]])),
            127 => {
                let mut bytes = [0u8; 8];
                bytes.copy_from_slice(&self.head[2..10]);
                u64::from_be_bytes(bytes)
            }
            n => u64::from(n),
        }
    }

    /// Goes through `data` up to the end of the current frame.
    fn step(&mut self, data: &[u8]) -> Step {
        let mut used = 0;
        if self.payload.is_none() {
            while self.have < self.head_len() {
                let Some(&byte) = data.get(used) else {
                    return Step {
                        used,
                        opcode: None,
                        ended: false,
                    };
                };
                self.head[self.have] = byte;
                self.have += 1;
                used += 1;
            }
            self.payload = Some((self.head[0] & 0x0f, self.payload_len()));
            self.have = 0;
        }
        let Some((opcode, left)) = self.payload else {
            return Step {
                used,
                opcode: None,
                ended: false,
            };
        };
        let take = usize::try_from(left)
            .unwrap_or(usize::MAX)
            .min(data.len() - used);
        used += take;
        let left = left - take as u64;
        self.payload = (left > 0).then_some((opcode, left));
        Step {
            used,
            opcode: Some(opcode),
            ended: left == 0,
        }
    }

    /// Goes through all of `data`.
    fn track(&mut self, mut data: &[u8]) {
        while !data.is_empty() {
            let used = self.step(data).used;
            data = data.get(used..).unwrap_or_default();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn frame(opcode: u8, payload: &[u8], mask: Option<[u8; 4]>) -> Vec<u8> {
        let mut out = vec![0x80 | opcode];
        let bit = if mask.is_some() { 0x80 } else { 0 };
        match payload.len() {
            n if n < 126 => out.push(bit | n as u8),
            n if n < 65536 => {
                out.push(bit | 126);
                out.extend_from_slice(&(n as u16).to_be_bytes());
            }
            n => {
                out.push(bit | 127);
                out.extend_from_slice(&(n as u64).to_be_bytes());
            }
        }
        if let Some(key) = mask {
            out.extend_from_slice(&key);
            out.extend(payload.iter().zip(key.iter().cycle()).map(|(b, k)| b ^ k));
        } else {
            out.extend_from_slice(payload);
        }
        out
    }

    #[test]
    fn frames_are_followed_across_any_split() {
        let mut stream = Vec::new();
        stream.extend(frame(1, b"hello", Some([1, 2, 3, 4])));
        stream.extend(frame(2, &vec![7u8; 300], None));
        stream.extend(frame(2, &vec![9u8; 70_000], Some([9, 9, 9, 9])));
        stream.extend(frame(OPCODE_CLOSE, &GOING_AWAY, None));
        for cut in [1, 2, 3, 7, 100, 4096, stream.len()] {
            let mut frames = Frames::default();
            let mut ends = Vec::new();
            for piece in stream.chunks(cut) {
                let mut rest = piece;
                while !rest.is_empty() {
                    let step = frames.step(rest);
                    rest = &rest[step.used..];
                    if step.ended {
                        ends.push(step.opcode);
                    }
                }
            }
            assert_eq!(ends, [Some(1), Some(2), Some(2), Some(8)], "split {cut}");
            assert!(frames.at_boundary());
        }
    }

    #[test]
    fn close_frames_say_going_away_masked_only_to_the_backend() {
        let plain = close_frame(false);
        assert_eq!(plain, [0x88, 2, 0x03, 0xe9]);
        let masked = close_frame(true);
        assert_eq!(masked.len(), 8);
        assert_eq!(&masked[..2], &[0x88, 0x82]);
        let key = &masked[2..6];
        assert_eq!([masked[6] ^ key[0], masked[7] ^ key[1]], [0x03, 0xe9]);
    }

    /// A backend that echoes frames and answers a close with its own.
    async fn echo_backend(mut io: tokio::io::DuplexStream) {
        let mut frames = Frames::default();
        let mut buf = vec![0u8; 1024];
        let mut current = Vec::new();
        loop {
            let Ok(n) = io.read(&mut buf).await else {
                return;
            };
            if n == 0 {
                return;
            }
            let mut rest = &buf[..n];
            while !rest.is_empty() {
                let step = frames.step(rest);
                current.extend_from_slice(&rest[..step.used]);
                rest = &rest[step.used..];
                if step.ended {
                    // Unmask the payload and send it back unmasked.
                    let masked = current[1] & 0x80 != 0;
                    let len = (current[1] & 0x7f) as usize;
                    let (key, payload) = if masked {
                        (current[2..6].to_vec(), current[6..6 + len].to_vec())
                    } else {
                        (vec![0; 4], current[2..2 + len].to_vec())
                    };
                    let plain: Vec<u8> = payload
                        .iter()
                        .zip(key.iter().cycle())
                        .map(|(b, k)| b ^ k)
                        .collect();
                    let _ = io
                        .write_all(&frame(step.opcode.unwrap_or(1), &plain, None))
                        .await;
                    current.clear();
                    if step.opcode == Some(OPCODE_CLOSE) {
                        let _ = io.shutdown().await;
                        return;
                    }
                }
            }
        }
    }

    #[tokio::test]
    async fn at_the_deadline_a_websocket_gets_its_answers_then_1001_both_ways() {
        let (client, mut client_peer) = tokio::io::duplex(64 * 1024);
        let (server, server_peer) = tokio::io::duplex(64 * 1024);
        tokio::spawn(echo_backend(server_peer));
        let (cut, cut_rx) = watch::channel(false);
        let moved = Arc::new(Moved::default());
        let relaying = {
            let moved = Arc::clone(&moved);
            tokio::spawn(async move { relay(client, server, true, &moved, cut_rx).await })
        };
        // A message and its echo.
        client_peer
            .write_all(&frame(1, b"ping", Some([1, 1, 1, 1])))
            .await
            .unwrap();
        let mut buf = vec![0u8; 64];
        let n = client_peer.read(&mut buf).await.unwrap();
        assert_eq!(&buf[..n], &frame(1, b"ping", None)[..]);
        // Half a frame is under way when the deadline passes.
        let last = frame(1, b"last words", Some([2, 2, 2, 2]));
        client_peer.write_all(&last[..5]).await.unwrap();
        cut.send_replace(true);
        tokio::time::sleep(Duration::from_millis(20)).await;
        client_peer.write_all(&last[5..]).await.unwrap();
        // Its echo arrives, then the close 1001; the client answers it.
        let mut got = Vec::new();
        let expected: Vec<u8> = frame(1, b"last words", None)
            .into_iter()
            .chain(close_frame(false))
            .collect();
        while got.len() < expected.len() {
            let n = client_peer.read(&mut buf).await.unwrap();
            assert!(n > 0, "closed early: {got:?}");
            got.extend_from_slice(&buf[..n]);
        }
        assert_eq!(got, expected);
        client_peer
            .write_all(&frame(OPCODE_CLOSE, &GOING_AWAY, Some([3, 3, 3, 3])))
            .await
            .unwrap();
        // Then a FIN.
        assert_eq!(client_peer.read(&mut buf).await.unwrap(), 0);
        let ended = tokio::time::timeout(Duration::from_secs(5), relaying)
            .await
            .unwrap()
            .unwrap()
            .unwrap();
        assert_eq!(ended, Ended::AtDeadline);
        assert!(moved.up.load(Ordering::Relaxed) > 0);
    }

    #[tokio::test(start_paused = true)]
    async fn a_backend_that_never_answers_the_close_still_leaves_the_client_a_1001() {
        let (client, mut client_peer) = tokio::io::duplex(1024);
        // A backend that reads everything and says nothing.
        let (server, mut server_peer) = tokio::io::duplex(1024);
        tokio::spawn(async move {
            let mut sink = vec![0u8; 1024];
            while matches!(server_peer.read(&mut sink).await, Ok(n) if n > 0) {}
        });
        let (cut, cut_rx) = watch::channel(false);
        let moved = Moved::default();
        let relaying = relay(client, server, true, &moved, cut_rx);
        let peer = async {
            cut.send_replace(true);
            let mut got = Vec::new();
            let mut buf = [0u8; 16];
            loop {
                let n = client_peer.read(&mut buf).await.unwrap();
                if n == 0 {
                    break;
                }
                got.extend_from_slice(&buf[..n]);
            }
            got
        };
        let (ended, got) = tokio::join!(relaying, peer);
        assert_eq!(ended.unwrap(), Ended::AtDeadline);
        assert_eq!(got, close_frame(false));
    }

    #[tokio::test]
    async fn another_tunnel_gets_a_fin_both_ways_at_the_deadline() {
        let (client, mut client_peer) = tokio::io::duplex(1024);
        let (server, mut server_peer) = tokio::io::duplex(1024);
        let (cut, cut_rx) = watch::channel(false);
        let moved = Moved::default();
        let relaying = relay(client, server, false, &moved, cut_rx);
        let peers = async {
            client_peer.write_all(b"abc").await.unwrap();
            let mut buf = [0u8; 3];
            server_peer.read_exact(&mut buf).await.unwrap();
            cut.send_replace(true);
            assert_eq!(client_peer.read(&mut buf).await.unwrap(), 0);
            assert_eq!(server_peer.read(&mut buf).await.unwrap(), 0);
        };
        let (ended, ()) = tokio::join!(relaying, peers);
        assert_eq!(ended.unwrap(), Ended::AtDeadline);
        assert_eq!(moved.up.load(Ordering::Relaxed), 3);
    }
}
