//! Listening sockets in per-worker groups.
//!
//! A listener is served by every data-plane worker, each accepting on a
//! socket of its own: the listener's *group*, sockets bound to the same
//! address with `SO_REUSEPORT`, among which the kernel spreads new
//! connections (by a hash of the client's address and port). No
//! connection is accepted on one thread and served on another.
//!
//! `SO_REUSEPORT` would also let another process of the same user join
//! the group and take part of the traffic without any error. A group is
//! therefore only ever formed after a plain bind of the address (without
//! the option) succeeded and was closed again: anything already listening
//! there, another process's group included, makes the bind fail as it
//! always did.

use std::io;
use std::net::SocketAddr;
use std::os::fd::{AsFd, OwnedFd};

use rustix::net::{sockopt, AddressFamily, SocketFlags, SocketType};

/// The listen backlog of every TCP listening socket.
const BACKLOG: i32 = 1024;

/// A socket of `kind` bound to `address`: close-on-exec, non-blocking,
/// `SO_REUSEADDR` for TCP (a restart binds while old connections sit in
/// TIME_WAIT), `SO_REUSEPORT` when it joins a group.
fn bound(address: SocketAddr, kind: SocketType, group: bool) -> io::Result<OwnedFd> {
    let family = if address.is_ipv4() {
        AddressFamily::INET
    } else {
        AddressFamily::INET6
    };
    let socket = rustix::net::socket_with(
        family,
        kind,
        SocketFlags::CLOEXEC | SocketFlags::NONBLOCK,
        None,
    )?;
    if kind == SocketType::STREAM {
        sockopt::set_socket_reuseaddr(&socket, true)?;
    }
    if group {
        sockopt::set_socket_reuseport(&socket, true)?;
    }
    rustix::net::bind(&socket, &address)?;
    Ok(socket)
}

/// The address a socket is bound to.
pub fn local_address(socket: impl AsFd) -> io::Result<SocketAddr> {
    SocketAddr::try_from(rustix::net::getsockname(socket)?)
        .map_err(|_| io::Error::new(io::ErrorKind::InvalidData, "not an IP socket"))
}

/// Whether `socket` may share its address with a group member.
pub fn in_group(socket: impl AsFd) -> bool {
    sockopt::socket_reuseport(socket).unwrap_or(false)
}

/// Binds `address` alone first, for the address actually bound (port 0
/// gets one) and to fail where anything listens already (see the module
/// documentation); then the group is formed at that address.
fn free_address(address: SocketAddr, kind: SocketType) -> io::Result<SocketAddr> {
    let probe = bound(address, kind, false)?;
    local_address(&probe)
}

/// `count` TCP listening sockets at `address`, and the address bound.
pub fn tcp_group(
    address: SocketAddr,
    count: usize,
) -> io::Result<(Vec<std::net::TcpListener>, SocketAddr)> {
    let local = free_address(address, SocketType::STREAM)?;
    let sockets = (0..count.max(1))
        .map(|_| tcp_member(local))
        .collect::<io::Result<Vec<_>>>()?;
    Ok((sockets, local))
}

/// One more listening socket in the group at `local` (bound already by
/// this process or handed over by its predecessor).
pub fn tcp_member(local: SocketAddr) -> io::Result<std::net::TcpListener> {
    let socket = bound(local, SocketType::STREAM, true)?;
    rustix::net::listen(&socket, BACKLOG)?;
    Ok(std::net::TcpListener::from(socket))
}

/// `count` UDP sockets at `address` (one QUIC endpoint each), and the
/// address bound.
pub fn udp_group(
    address: SocketAddr,
    count: usize,
) -> io::Result<(Vec<std::net::UdpSocket>, SocketAddr)> {
    let local = free_address(address, SocketType::DGRAM)?;
    let sockets = (0..count.max(1))
        .map(|_| bound(local, SocketType::DGRAM, true).map(std::net::UdpSocket::from))
        .collect::<io::Result<Vec<_>>>()?;
    Ok((sockets, local))
}

/// Steers every datagram reaching a UDP group to the member whose QUIC
/// endpoint issued its destination connection ID: the six low bits of
/// each endpoint's IDs' first byte are congruent to its member index
/// modulo `members` (the top two name the process, see
/// `steering::WorkerCids`), and this program, attached to the group,
/// reads that byte (offset 1 in a short header, 6 in a long one) and
/// returns its low bits modulo `members` as the member to deliver to. A
/// client's first Initial packets carry an ID the client chose, which
/// lands on some member consistently, the one whose endpoint then issues
/// the IDs the client uses from there on. Without steering the kernel
/// would pick by the client's address and port, and a client whose
/// address changes (a NAT rebinding, a migration) would reach an
/// endpoint that does not know its connection.
pub fn steer_quic(socket: &std::net::UdpSocket, members: usize) -> io::Result<()> {
    let members = u32::try_from(members)
        .ok()
        .filter(|m| (1..=super::steering::MAX_MEMBERS as u32).contains(m))
        .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidInput, "1 to 64 members"))?;
    // Classic BPF (`linux/filter.h`), run on the UDP payload.
    let op = |code: u32, jt: u8, jf: u8, k: u32| libc::sock_filter {
        code: code as u16,
        jt,
        jf,
        k,
    };
    let program = [
        // 0: A = the first byte (header form in its top bit)
        op(libc::BPF_LD | libc::BPF_B | libc::BPF_ABS, 0, 0, 0),
        // 1: long header? to 2, else to 4
        op(libc::BPF_JMP | libc::BPF_JSET | libc::BPF_K, 0, 2, 0x80),
        // 2: A = the destination ID's first byte in a long header
        op(libc::BPF_LD | libc::BPF_B | libc::BPF_ABS, 0, 0, 6),
        // 3: to 5
        op(libc::BPF_JMP | libc::BPF_JA, 0, 0, 1),
        // 4: A = the destination ID's first byte in a short header
        op(libc::BPF_LD | libc::BPF_B | libc::BPF_ABS, 0, 0, 1),
        // 5: A &= the member bits (the process's tag is not a member)
        op(
            libc::BPF_ALU | libc::BPF_AND | libc::BPF_K,
            0,
            0,
            u32::from(super::steering::MEMBER_BITS),
        ),
        // 6: A %= members
        op(libc::BPF_ALU | libc::BPF_MOD | libc::BPF_K, 0, 0, members),
        // 7: deliver to member A
        op(libc::BPF_RET | libc::BPF_A, 0, 0, 0),
    ];
    attach_reuseport_program(socket, &program)
}

/// `SO_ATTACH_REUSEPORT_CBPF` as `asm-generic/socket.h` numbers it (the
/// libc crate names it for Android only); the architectures with socket
/// options of their own are left without steering.
const SO_ATTACH_REUSEPORT_CBPF: Option<libc::c_int> = if cfg!(any(
    target_arch = "x86_64",
    target_arch = "x86",
    target_arch = "aarch64",
    target_arch = "arm",
    target_arch = "riscv64"
)) {
    Some(51)
} else {
    None
};

fn attach_reuseport_program(
    socket: &std::net::UdpSocket,
    program: &[libc::sock_filter],
) -> io::Result<()> {
    use std::os::fd::AsRawFd;
    let option = SO_ATTACH_REUSEPORT_CBPF.ok_or_else(|| {
        io::Error::new(
            io::ErrorKind::Unsupported,
            "no reuseport steering on this architecture",
        )
    })?;
    let len = u16::try_from(program.len())
        .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "program too long"))?;
    let fprog = libc::sock_fprog {
        len,
        filter: program.as_ptr().cast_mut(),
    };
    #[allow(unsafe_code)]
    // SAFETY: `fprog` points at `program`, `len` instructions long, both
    // alive across the call; the kernel copies the program and does not
    // keep the pointer. The descriptor is open (borrowed from `socket`).
    let done = unsafe {
        libc::setsockopt(
            socket.as_raw_fd(),
            libc::SOL_SOCKET,
            option,
            std::ptr::from_ref(&fprog).cast(),
            std::mem::size_of::<libc::sock_fprog>() as libc::socklen_t,
        )
    };
    if done == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

/// Which of a group's `sockets` worker `worker` of `workers` accepts
/// on: its own share when there are at least as many sockets as workers
/// (every socket is served, by one worker); otherwise one socket that it
/// shares with other workers (a group handed over by a process with fewer
/// workers, or a single socket without `SO_REUSEPORT` from an older
/// build), so that every worker still accepts.
pub fn share(worker: usize, workers: usize, sockets: usize) -> Vec<usize> {
    if sockets == 0 || workers == 0 {
        return Vec::new();
    }
    if sockets < workers {
        return vec![worker % sockets];
    }
    (worker..sockets).step_by(workers).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_socket_is_served_and_every_worker_accepts() {
        for workers in 1..=4 {
            for sockets in 1..=6 {
                let shares: Vec<Vec<usize>> =
                    (0..workers).map(|w| share(w, workers, sockets)).collect();
                assert!(shares.iter().all(|s| !s.is_empty()), "{workers}/{sockets}");
                let mut served: Vec<usize> = shares.concat();
                served.sort_unstable();
                served.dedup();
                assert_eq!(served, (0..sockets).collect::<Vec<_>>());
                if sockets >= workers {
                    assert_eq!(shares.concat().len(), sockets, "no socket served twice");
                }
            }
        }
    }

    #[test]
    fn a_group_forms_where_nothing_listens_and_nowhere_else() {
        let (group, local) = tcp_group("127.0.0.1:0".parse().unwrap(), 3).unwrap();
        assert_eq!(group.len(), 3);
        assert_ne!(local.port(), 0);
        for socket in &group {
            assert_eq!(socket.local_addr().unwrap(), local);
            assert!(in_group(socket));
        }
        // Another group at the same address (another process would do
        // the same) is refused, not joined.
        let again = tcp_group(local, 2).unwrap_err();
        assert_eq!(again.kind(), io::ErrorKind::AddrInUse);
        // So is a plain socket there, as before groups.
        let plain = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let taken = tcp_group(plain.local_addr().unwrap(), 2).unwrap_err();
        assert_eq!(taken.kind(), io::ErrorKind::AddrInUse);
        // A member joins a group this process holds.
        let member = tcp_member(local).unwrap();
        assert_eq!(member.local_addr().unwrap(), local);
        let (udp, udp_local) = udp_group("127.0.0.1:0".parse().unwrap(), 2).unwrap();
        assert_eq!(udp.len(), 2);
        assert_eq!(
            udp_group(udp_local, 1).unwrap_err().kind(),
            io::ErrorKind::AddrInUse
        );
    }

    /// The kernel delivers each QUIC packet to the member its destination
    /// ID names, whatever the client's address and port and whichever
    /// process issued the ID.
    #[test]
    fn quic_packets_reach_the_member_their_connection_id_names() {
        let members = 3;
        let (group, local) = udp_group("127.0.0.1:0".parse().unwrap(), members).unwrap();
        steer_quic(&group[0], members).unwrap();
        for socket in &group {
            socket.set_nonblocking(false).unwrap();
            socket
                .set_read_timeout(Some(std::time::Duration::from_secs(2)))
                .unwrap();
        }
        for first in (0..4u8).flat_map(|tag| (0..6u8).map(move |low| (tag << 6) | low)) {
            // A new client address each time: no hashing could line up.
            let client = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
            let short = [0x40, first, 1, 2, 3, 4, 5, 6, 7, 8];
            let long = [0xc0, 0, 0, 0, 1, 8, first, 9, 9, 9, 9, 9, 9, 9, 0];
            for packet in [&short[..], &long[..]] {
                client.send_to(packet, local).unwrap();
                let index = usize::from(first & 0x3f) % members;
                let mut buf = [0u8; 64];
                let (n, _) = group[index].recv_from(&mut buf).unwrap();
                assert_eq!(&buf[..n], packet, "member {index}");
            }
        }
    }
}
