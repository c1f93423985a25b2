//! Where a QUIC packet goes: to the endpoint, and the process, whose
//! connection it belongs to.
//!
//! Within a process, the kernel steers a datagram to a member of the
//! listener's UDP group by the first byte of its destination connection
//! ID (`sockets::steer_quic`). Across a drain-aware upgrade the group is
//! handed over: the old and the new process read the same sockets, each
//! endpoint of one with its counterpart of the other, and a packet may be
//! read by the process that does not know its connection. The top two
//! bits of that byte name the process that issued the ID (its [`Tag`],
//! one more at every upgrade, modulo 4), and the two processes are joined,
//! member by member, by a relay (a `SOCK_SEQPACKET` socket pair): a packet
//! read by the wrong one is sent over the relay to the right one, which
//! handles it as if it had read it itself and answers from the shared
//! socket. A client's first packets (Initial, 0-RTT) carry an ID it chose
//! at random; they stay where they are read while that process accepts
//! connections, and go to its successor once it drains. So the old
//! process's connections finish there, and the new process serves new
//! connections from the moment it starts: an upgrade resets none, and
//! HTTP/3 has no gap.

use std::io::{self, IoSliceMut};
use std::net::{IpAddr, Ipv6Addr, SocketAddr};
use std::os::fd::OwnedFd;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::task::{Context, Poll};

use quinn::udp::{EcnCodepoint, RecvMeta, Transmit};
use quinn::{AsyncUdpSocket, UdpPoller};

/// How long the IDs an endpoint issues are.
pub const CID_LEN: usize = 8;

/// Group members steering can tell apart: the six low bits of an ID's
/// first byte.
pub const MAX_MEMBERS: usize = 64;

/// The bits of an ID's first byte that name the member.
pub const MEMBER_BITS: u8 = 0x3f;

/// Which process issued a connection ID: one more at every upgrade.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Tag(u8);

impl Tag {
    pub fn new(value: u8) -> Self {
        Self(value & 0b11)
    }

    pub fn value(self) -> u8 {
        self.0
    }

    /// The successor's tag.
    pub fn next(self) -> Self {
        Self::new(self.0 + 1)
    }

    fn of(first: u8) -> Self {
        Self(first >> 6)
    }
}

thread_local! {
    /// While an endpoint sends a Retry from this thread: the member the
    /// Retry's connection ID names instead of the endpoint's own.
    static RETRY_MEMBER: std::cell::Cell<Option<usize>> = const { std::cell::Cell::new(None) };
}

/// Runs `retry` (which makes a Retry's connection ID on this thread)
/// with that ID naming `member`.
pub fn retrying_to<T>(member: usize, retry: impl FnOnce() -> T) -> T {
    RETRY_MEMBER.with(|m| m.set(Some(member)));
    let done = retry();
    RETRY_MEMBER.with(|m| m.set(None));
    done
}

/// The connection IDs an endpoint issues: 8 bytes, random but for the
/// first, whose top two bits are the process's tag and whose six low
/// bits are congruent to the endpoint's member index modulo the group's
/// size (what `sockets::steer_quic` reads); a Retry's names the member it
/// sends the client to ([`retrying_to`]).
pub struct WorkerCids {
    pub member: usize,
    pub members: usize,
    pub tag: Tag,
}

impl quinn::ConnectionIdGenerator for WorkerCids {
    fn generate_cid(&mut self) -> quinn::ConnectionId {
        let mut bytes = [0u8; CID_LEN];
        // An ID only has to be unpredictable enough not to link a
        // client's paths; a failing system generator leaves zeros after
        // the first byte, which still steers.
        let _ = ring::rand::SecureRandom::fill(&ring::rand::SystemRandom::new(), &mut bytes);
        let members = self.members.clamp(1, MAX_MEMBERS);
        let member = RETRY_MEMBER
            .with(std::cell::Cell::get)
            .unwrap_or(self.member)
            % members;
        // The largest multiple of `members` that leaves room for the index.
        let spans = (MAX_MEMBERS - member).div_ceil(members);
        let span = usize::from(bytes[0]) % spans;
        let low = u8::try_from(span * members + member).unwrap_or(0) & MEMBER_BITS;
        bytes[0] = (self.tag.0 << 6) | low;
        quinn::ConnectionId::new(&bytes)
    }

    fn cid_len(&self) -> usize {
        CID_LEN
    }

    fn cid_lifetime(&self) -> Option<std::time::Duration> {
        None
    }
}

/// Where a packet read from the UDP socket is handled.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Route {
    Here,
    Predecessor,
    Successor,
}

/// Where `packet`, read by the process tagged `own`, belongs: a client's
/// first packets (Initial, 0-RTT: an ID it chose) stay unless this
/// process drains (`initials_on`); any other goes to the process its ID
/// names, the one before or after this one, or stays when it names this
/// one (or none known: the endpoint answers as it would).
fn route(packet: &[u8], own: Tag, initials_on: bool) -> Route {
    let Some(&first) = packet.first() else {
        return Route::Here;
    };
    let id_first = if first & 0x80 != 0 {
        // Long header: flags, version (4), ID length, ID.
        match packet.get(1..7) {
            Some([0, 0, 0, 0, _, _]) | Some([_, _, _, _, 0, _]) | None => return Route::Here,
            Some([.., id]) => {
                // QUIC v1 packet types 0 (Initial) and 1 (0-RTT).
                if first & 0x30 <= 0x10 {
                    return if initials_on {
                        Route::Successor
                    } else {
                        Route::Here
                    };
                }
                *id
            }
            Some(_) => return Route::Here,
        }
    } else {
        match packet.get(1) {
            Some(id) => *id,
            None => return Route::Here,
        }
    };
    match Tag::of(id_first).0.wrapping_sub(own.0) & 0b11 {
        1 => Route::Successor,
        3 => Route::Predecessor,
        _ => Route::Here,
    }
}

/// Bytes before a relayed packet: the client's address (family, 16
/// address bytes, port), the address it reached (family or 0, 16 bytes)
/// and the ECN bits.
const HEADER: usize = 1 + 16 + 2 + 1 + 16 + 1;

fn put_ip(out: &mut Vec<u8>, ip: Option<IpAddr>) {
    match ip {
        Some(IpAddr::V4(v4)) => {
            out.push(4);
            out.extend_from_slice(&v4.to_ipv6_mapped().octets());
        }
        Some(IpAddr::V6(v6)) => {
            out.push(6);
            out.extend_from_slice(&v6.octets());
        }
        None => {
            out.push(0);
            out.extend_from_slice(&[0; 16]);
        }
    }
}

fn get_ip(family: u8, octets: &[u8]) -> Option<IpAddr> {
    let octets: [u8; 16] = octets.try_into().ok()?;
    let v6 = Ipv6Addr::from(octets);
    match family {
        4 => v6.to_ipv4_mapped().map(IpAddr::V4),
        6 => Some(IpAddr::V6(v6)),
        _ => None,
    }
}

/// `packet` as it crosses a relay.
fn encode(out: &mut Vec<u8>, from: SocketAddr, to: Option<IpAddr>, ecn: u8, packet: &[u8]) {
    out.clear();
    put_ip(out, Some(from.ip()));
    out.extend_from_slice(&from.port().to_be_bytes());
    put_ip(out, to);
    out.push(ecn);
    out.extend_from_slice(packet);
}

/// A relayed packet: its client, the address it reached, its ECN bits
/// and the packet.
fn decode(message: &[u8]) -> Option<(SocketAddr, Option<IpAddr>, u8, &[u8])> {
    if message.len() <= HEADER {
        return None;
    }
    let from = get_ip(message[0], &message[1..17])?;
    let port = u16::from_be_bytes([message[17], message[18]]);
    let to = get_ip(message[19], &message[20..36]);
    Some((
        SocketAddr::new(from, port),
        to,
        message[36],
        &message[HEADER..],
    ))
}

/// A relay pair: one end stays, the other is handed to the successor.
pub fn relay_pair() -> io::Result<(OwnedFd, OwnedFd)> {
    use rustix::net::{AddressFamily, SocketFlags, SocketType};
    Ok(rustix::net::socketpair(
        AddressFamily::UNIX,
        SocketType::SEQPACKET,
        SocketFlags::CLOEXEC | SocketFlags::NONBLOCK,
        None,
    )?)
}

/// What an endpoint's socket shares with the process: the successor's
/// end of a relay once an upgrade starts one, and whether the listener
/// drains.
pub struct Link {
    offered: Mutex<Option<OwnedFd>>,
    draining: Arc<AtomicBool>,
}

impl Link {
    pub fn new(draining: Arc<AtomicBool>) -> Arc<Self> {
        Arc::new(Self {
            offered: Mutex::new(None),
            draining,
        })
    }

    /// Joins this endpoint to its counterpart in a successor process.
    pub fn offer_successor(&self, relay: OwnedFd) {
        *self.offered.lock().unwrap_or_else(PoisonError::into_inner) = Some(relay);
    }

    fn take_offered(&self) -> Option<OwnedFd> {
        self.offered
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .take()
    }
}

/// One relay to a neighbouring process, and what crossed it. The
/// socket is a `SOCK_SEQPACKET` pair's end, driven as tokio's Unix
/// stream: its reads and writes are `read(2)`/`write(2)`, which on this
/// socket type move one whole message each (a read of 0 is the other end
/// closing), with readiness from the runtime.
struct Relay {
    socket: tokio::net::UnixStream,
    sent: u64,
    received: u64,
}

impl Relay {
    fn new(fd: OwnedFd) -> io::Result<Self> {
        Ok(Self {
            socket: tokio::net::UnixStream::from_std(std::os::unix::net::UnixStream::from(fd))?,
            sent: 0,
            received: 0,
        })
    }
}

#[derive(Default)]
struct Relays {
    predecessor: Option<Relay>,
    successor: Option<Relay>,
    /// What a relay read, before it is copied out.
    scratch: Vec<u8>,
    /// What goes out over a relay.
    outgoing: Vec<u8>,
}

/// The socket a QUIC endpoint reads and writes through: the UDP socket,
/// with the packets of the other process's connections sent over the
/// relay and the packets the other process relays read as if from the
/// socket.
pub struct SteeredSocket {
    inner: Arc<dyn AsyncUdpSocket>,
    tag: Tag,
    link: Arc<Link>,
    listener: Arc<str>,
    relays: Mutex<Relays>,
    /// Packets a relay refused (full, or the other process gone), handled
    /// here instead; logged when a relay closes.
    dropped: AtomicU64,
}

impl std::fmt::Debug for SteeredSocket {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SteeredSocket")
            .field("tag", &self.tag)
            .finish_non_exhaustive()
    }
}

impl SteeredSocket {
    /// `socket` for an endpoint of the process tagged `tag`, joined to its
    /// predecessor's counterpart by `predecessor` (handed over by it).
    /// Must be called on the runtime that polls the endpoint.
    pub fn new(
        socket: std::net::UdpSocket,
        tag: Tag,
        link: Arc<Link>,
        predecessor: Option<OwnedFd>,
        listener: Arc<str>,
    ) -> io::Result<Arc<Self>> {
        let inner = quinn::Runtime::wrap_udp_socket(&quinn::TokioRuntime, socket)?;
        let predecessor = predecessor.map(Relay::new).transpose()?;
        Ok(Arc::new(Self {
            inner,
            tag,
            link,
            listener,
            relays: Mutex::new(Relays {
                predecessor,
                ..Relays::default()
            }),
            dropped: AtomicU64::new(0),
        }))
    }

    /// A packet the other process relayed, into `buf`/`meta`; `None`
    /// when none is waiting (the task is woken when one arrives).
    fn poll_relayed(
        &self,
        relays: &mut Relays,
        cx: &mut Context,
        buf: &mut IoSliceMut<'_>,
        meta: &mut RecvMeta,
    ) -> Option<usize> {
        let Relays {
            predecessor,
            successor,
            scratch,
            ..
        } = relays;
        if predecessor.is_none() && successor.is_none() {
            return None;
        }
        // Sized once: the largest packet a relay carries, and its header.
        if scratch.len() < HEADER + usize::from(u16::MAX) {
            scratch.resize(HEADER + usize::from(u16::MAX), 0);
        }
        for (slot, side) in [(predecessor, "previous"), (successor, "next")] {
            let Some(relay) = slot else { continue };
            let read = loop {
                match relay.socket.poll_read_ready(cx) {
                    Poll::Ready(Ok(())) => {}
                    Poll::Ready(Err(error)) => break Err(error),
                    Poll::Pending => break Ok(None),
                }
                match relay.socket.try_read(scratch) {
                    Err(error) if error.kind() == io::ErrorKind::WouldBlock => continue,
                    read => break read.map(Some),
                }
            };
            match read {
                Ok(None) => {}
                Ok(Some(n)) if n > 0 => {
                    relay.received += 1;
                    let Some((from, to, ecn, packet)) = decode(&scratch[..n]) else {
                        continue;
                    };
                    let len = packet.len().min(buf.len());
                    buf[..len].copy_from_slice(&packet[..len]);
                    meta.addr = from;
                    meta.len = len;
                    meta.stride = len;
                    meta.ecn = EcnCodepoint::from_bits(ecn);
                    meta.dst_ip = to;
                    return Some(1);
                }
                // The other process is gone (end of file) or the relay broke.
                Ok(Some(_)) | Err(_) => {
                    if let Some(relay) = slot.take() {
                        let not_relayed = self.dropped.load(Ordering::Relaxed);
                        tracing::info!(listener = %self.listener, process = side, relayed_to = relay.sent, relayed_from = relay.received, not_relayed, "QUIC relay to the {side} process closed");
                    }
                }
            }
        }
        None
    }

    /// Sends the packets of `meta`/`bufs` that belong to the other process
    /// over the relay and leaves the rest to the endpoint (a message all
    /// of whose packets left is emptied; one with some of each keeps its
    /// own, moved together).
    fn steer(&self, relays: &mut Relays, bufs: &mut [IoSliceMut<'_>], meta: &mut [RecvMeta]) {
        if relays.predecessor.is_none() && relays.successor.is_none() {
            return;
        }
        let initials_on = self.link.draining.load(Ordering::Relaxed) && relays.successor.is_some();
        for (meta, buf) in meta.iter_mut().zip(bufs.iter_mut()) {
            let stride = meta.stride.max(1);
            let mut kept = 0;
            let mut start = 0;
            while start < meta.len {
                let end = (start + stride).min(meta.len);
                let packet = &buf[start..end];
                let route = route(packet, self.tag, initials_on);
                let slot = match route {
                    Route::Here => None,
                    Route::Predecessor => relays.predecessor.as_mut(),
                    Route::Successor => relays.successor.as_mut(),
                };
                let relayed = slot.is_some_and(|relay| {
                    encode(
                        &mut relays.outgoing,
                        meta.addr,
                        meta.dst_ip,
                        meta.ecn.map_or(0, |e| e as u8),
                        packet,
                    );
                    match relay.socket.try_write(&relays.outgoing) {
                        Ok(_) => {
                            relay.sent += 1;
                            true
                        }
                        Err(_) => {
                            // Full or gone: handled here, as without a
                            // relay (the endpoint answers what it can).
                            self.dropped.fetch_add(1, Ordering::Relaxed);
                            false
                        }
                    }
                });
                if !relayed {
                    if start != kept {
                        buf.copy_within(start..end, kept);
                    }
                    kept += end - start;
                }
                start = end;
            }
            meta.len = kept;
        }
    }
}

impl AsyncUdpSocket for SteeredSocket {
    fn create_io_poller(self: Arc<Self>) -> std::pin::Pin<Box<dyn UdpPoller>> {
        Arc::clone(&self.inner).create_io_poller()
    }

    fn try_send(&self, transmit: &Transmit) -> io::Result<()> {
        self.inner.try_send(transmit)
    }

    fn poll_recv(
        &self,
        cx: &mut Context,
        bufs: &mut [IoSliceMut<'_>],
        meta: &mut [RecvMeta],
    ) -> Poll<io::Result<usize>> {
        let mut relays = self.relays.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(offered) = self.link.take_offered() {
            match Relay::new(offered) {
                Ok(relay) => relays.successor = Some(relay),
                Err(error) => {
                    tracing::warn!(listener = %self.listener, %error, "QUIC relay to the next process not set up; its packets read here are answered here")
                }
            }
        }
        if let (Some(buf), Some(first)) = (bufs.first_mut(), meta.first_mut()) {
            if let Some(n) = self.poll_relayed(&mut relays, cx, buf, first) {
                return Poll::Ready(Ok(n));
            }
        }
        let read = self.inner.poll_recv(cx, bufs, meta);
        if let Poll::Ready(Ok(n)) = read {
            let n = n.min(meta.len()).min(bufs.len());
            self.steer(&mut relays, &mut bufs[..n], &mut meta[..n]);
        }
        read
    }

    fn local_addr(&self) -> io::Result<SocketAddr> {
        self.inner.local_addr()
    }

    fn max_transmit_segments(&self) -> usize {
        self.inner.max_transmit_segments()
    }

    fn max_receive_segments(&self) -> usize {
        self.inner.max_receive_segments()
    }

    fn may_fragment(&self) -> bool {
        self.inner.may_fragment()
    }
}

/// A listener's UDP group as a drain-aware upgrade hands it over: the
/// sockets, in group order, and each endpoint's link.
pub struct QuicGroup {
    pub tag: Tag,
    pub sockets: Vec<std::net::UdpSocket>,
    pub links: Vec<Arc<Link>>,
}

/// A group as the successor adopts it: the tag its IDs carry, the
/// sockets in group order, and its end of each member's relay.
pub struct InheritedGroup {
    pub tag: Tag,
    pub sockets: Vec<std::net::UdpSocket>,
    pub relays: Vec<OwnedFd>,
}

/// What the successor gets of a [`QuicGroup`]: its tag, duplicates of the
/// sockets and its ends of the relays, member by member.
pub struct HandedGroup {
    pub tag: Tag,
    pub sockets: Vec<OwnedFd>,
    pub relays: Vec<OwnedFd>,
}

impl QuicGroup {
    /// Joins every endpoint to a counterpart in the successor about to
    /// start, and returns what it inherits.
    pub fn hand_over(&self) -> io::Result<HandedGroup> {
        let mut sockets = Vec::with_capacity(self.sockets.len());
        let mut ours = Vec::with_capacity(self.sockets.len());
        let mut theirs = Vec::with_capacity(self.sockets.len());
        for socket in &self.sockets {
            sockets.push(OwnedFd::from(socket.try_clone()?));
            let (here, there) = relay_pair()?;
            ours.push(here);
            theirs.push(there);
        }
        // Only once every pair exists: all members are joined, or none.
        for (link, relay) in self.links.iter().zip(ours) {
            link.offer_successor(relay);
        }
        Ok(HandedGroup {
            tag: self.tag.next(),
            sockets,
            relays: theirs,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use quinn::ConnectionIdGenerator;

    fn short(id_first: u8) -> Vec<u8> {
        let mut packet = vec![0x40, id_first];
        packet.extend_from_slice(&[7; 30]);
        packet
    }

    fn long(kind: u8, id_first: u8) -> Vec<u8> {
        let mut packet = vec![0xc0 | (kind << 4), 0, 0, 0, 1, 8, id_first];
        packet.extend_from_slice(&[7; 40]);
        packet
    }

    #[test]
    fn a_packet_goes_to_the_process_its_connection_id_names() {
        let own = Tag::new(1);
        let id = |tag: u8, member: u8| (tag << 6) | member;
        for packet in [short(id(1, 5)), long(2, id(1, 5))] {
            assert_eq!(route(&packet, own, false), Route::Here);
            assert_eq!(route(&packet, own, true), Route::Here);
        }
        assert_eq!(route(&short(id(0, 3)), own, false), Route::Predecessor);
        assert_eq!(route(&long(2, id(0, 3)), own, false), Route::Predecessor);
        assert_eq!(route(&short(id(2, 3)), own, false), Route::Successor);
        // Two upgrades away: nothing this process knows.
        assert_eq!(route(&short(id(3, 3)), own, false), Route::Here);
        // The tag wraps: 3 is 0's predecessor.
        assert_eq!(
            route(&short(id(3, 0)), Tag::new(0), false),
            Route::Predecessor
        );
    }

    #[test]
    fn a_clients_first_packets_stay_unless_this_process_drains() {
        for kind in [0, 1] {
            for tag in 0..4 {
                let packet = long(kind, tag << 6);
                assert_eq!(route(&packet, Tag::new(2), false), Route::Here);
                assert_eq!(route(&packet, Tag::new(2), true), Route::Successor);
            }
        }
        // Version negotiation, an empty ID, a runt: answered here.
        let mut negotiation = long(0, 0x40);
        negotiation[1..5].copy_from_slice(&[0, 0, 0, 0]);
        assert_eq!(route(&negotiation, Tag::new(0), true), Route::Here);
        let mut empty = long(2, 0x40);
        empty[5] = 0;
        assert_eq!(route(&empty, Tag::new(0), true), Route::Here);
        assert_eq!(route(&[0x40], Tag::new(0), true), Route::Here);
        assert_eq!(route(&[], Tag::new(0), true), Route::Here);
    }

    #[test]
    fn a_relayed_packet_keeps_its_addresses_and_ecn() {
        let mut out = Vec::new();
        for (from, to) in [
            ("192.0.2.7:4433", Some("127.0.0.1")),
            ("[2001:db8::1]:443", Some("::1")),
            ("127.0.0.1:9", None),
        ] {
            let from: SocketAddr = from.parse().unwrap();
            let to: Option<IpAddr> = to.map(|t| t.parse().unwrap());
            encode(&mut out, from, to, 2, b"packet");
            assert_eq!(decode(&out), Some((from, to, 2, &b"packet"[..])));
        }
        assert_eq!(decode(&out[..HEADER]), None, "no packet, no message");
    }

    #[test]
    fn an_endpoints_connection_ids_name_its_member_and_process() {
        for tag in 0..4 {
            for members in [1, 2, 3, 7, 64] {
                for member in 0..members {
                    let mut cids = WorkerCids {
                        member,
                        members,
                        tag: Tag::new(tag),
                    };
                    let mut firsts = std::collections::BTreeSet::new();
                    for _ in 0..200 {
                        let cid = cids.generate_cid();
                        assert_eq!(cid.len(), CID_LEN);
                        assert_eq!(usize::from(cid[0] & MEMBER_BITS) % members, member);
                        assert_eq!(cid[0] >> 6, tag);
                        firsts.insert(cid[0]);
                    }
                    // Not one fixed byte where there is room for more.
                    assert!(members == 64 || firsts.len() > 1, "{members}/{member}");
                }
            }
        }
    }

    #[test]
    fn a_retrys_connection_id_names_the_member_it_sends_the_client_to() {
        let mut cids = WorkerCids {
            member: 1,
            members: 3,
            tag: Tag::new(2),
        };
        for _ in 0..64 {
            assert_eq!((cids.generate_cid()[0] & MEMBER_BITS) % 3, 1);
        }
        let retry = retrying_to(2, || cids.generate_cid());
        assert_eq!((retry[0] & MEMBER_BITS) % 3, 2);
        assert_eq!(retry[0] >> 6, 2, "the process's own tag");
        assert_eq!(
            (cids.generate_cid()[0] & MEMBER_BITS) % 3,
            1,
            "only while the Retry is made"
        );
    }

    #[tokio::test]
    async fn a_packet_read_by_the_wrong_process_crosses_the_relay() {
        use std::io::IoSliceMut;
        // Two processes' endpoints on one socket: the old one (tag 0)
        // and the new one (tag 1), joined by a relay.
        let socket = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
        let address = socket.local_addr().unwrap();
        let draining = Arc::new(AtomicBool::new(false));
        let old_link = Link::new(Arc::clone(&draining));
        let (here, there) = relay_pair().unwrap();
        old_link.offer_successor(here);
        let old = SteeredSocket::new(
            socket.try_clone().unwrap(),
            Tag::new(0),
            old_link,
            None,
            "l".into(),
        )
        .unwrap();
        let new = SteeredSocket::new(
            socket,
            Tag::new(1),
            Link::new(Arc::new(AtomicBool::new(false))),
            Some(there),
            "l".into(),
        )
        .unwrap();
        let client = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
        let from = client.local_addr().unwrap();
        let recv = |socket: &Arc<SteeredSocket>| {
            let socket = Arc::clone(socket);
            async move {
                let mut storage = vec![0u8; 65536];
                let mut bufs = [IoSliceMut::new(&mut storage)];
                let mut meta = [RecvMeta::default()];
                let n = tokio::time::timeout(
                    std::time::Duration::from_secs(5),
                    std::future::poll_fn(|cx| socket.poll_recv(cx, &mut bufs, &mut meta)),
                )
                .await
                .expect("a packet in time")
                .unwrap();
                assert_eq!(n, 1);
                (meta[0].addr, bufs[0][..meta[0].len].to_vec())
            }
        };
        // The old process's packet, read by the new one (nothing else
        // reads the socket meanwhile): handed to the old one, untouched.
        let packet = short(0x05);
        client.send_to(&packet, address).unwrap();
        let (addr, emptied) = recv(&new).await;
        assert_eq!((addr, emptied.len()), (from, 0), "not the new one's");
        let (addr, relayed) = recv(&old).await;
        assert_eq!((addr, relayed), (from, packet));
        // The new process's packet, read by the old one: relayed back.
        let packet = short(0x45);
        client.send_to(&packet, address).unwrap();
        assert_eq!(recv(&old).await.1.len(), 0);
        assert_eq!(recv(&new).await, (from, packet));
        // A new client while the old one drains: to the new one.
        draining.store(true, Ordering::Relaxed);
        let packet = long(0, 0x05);
        client.send_to(&packet, address).unwrap();
        assert_eq!(recv(&old).await.1.len(), 0);
        assert_eq!(recv(&new).await.1, packet);
        // Once the old one is gone, its packets stay where they are read.
        drop(old);
        let packet = short(0x05);
        client.send_to(&packet, address).unwrap();
        assert_eq!(recv(&new).await.1, packet);
    }
}
