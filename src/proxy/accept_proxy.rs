//! The PROXY protocol (HAProxy's, v1 text and v2 binary) as a trusted
//! proxy in front of a listener starts its connections with: the `ppp`
//! crate parses the header; this module frames it on the socket. (The
//! header towards backends is `backends::ProxyHeader`.)

use std::io;
use std::net::SocketAddr;
use std::time::Duration;

use ppp::v2;
use tokio::io::AsyncReadExt;
use tokio::net::TcpStream;

/// Why a connection's PROXY header was refused.
#[derive(Debug, thiserror::Error)]
pub enum HeaderError {
    #[error("no PROXY header within {0:?}")]
    Timeout(Duration),
    #[error("the connection does not start with a PROXY header")]
    Missing,
    #[error("malformed PROXY header: {0}")]
    Malformed(String),
    #[error(transparent)]
    Io(#[from] io::Error),
}

/// A v2 header's fixed part: signature, version and command, family and
/// protocol, and the length of what follows.
const V2_FIXED: usize = 16;
/// The shortest v1 header, `PROXY UNKNOWN\r\n`.
const V1_SHORTEST: usize = 15;
/// The longest v1 header (the specification's 107 bytes).
const V1_LONGEST: usize = 107;

/// Reads the PROXY header a connection starts with, within `timeout`,
/// and not a byte past it (what follows is the client's). Returns the
/// client address it carries; `None` for a `LOCAL` or `UNKNOWN` header
/// (a health check of the proxy in front: the peer is the client then).
pub async fn read(
    stream: &mut TcpStream,
    timeout: Duration,
) -> Result<Option<SocketAddr>, HeaderError> {
    tokio::time::timeout(timeout, read_header(stream))
        .await
        .map_err(|_| HeaderError::Timeout(timeout))?
}

async fn read_header(stream: &mut TcpStream) -> Result<Option<SocketAddr>, HeaderError> {
    // Both versions are at least this long, so this never reads into the
    // client's own bytes.
    let mut head = vec![0u8; V1_SHORTEST];
    stream.read_exact(&mut head).await?;
    if head.starts_with(v2::PROTOCOL_PREFIX) {
        // The fixed part ends with the length of what follows.
        head.resize(V2_FIXED, 0);
        stream.read_exact(&mut head[V1_SHORTEST..]).await?;
        let length = usize::from(u16::from_be_bytes([head[14], head[15]]));
        head.resize(V2_FIXED + length, 0);
        stream.read_exact(&mut head[V2_FIXED..]).await?;
        let header = v2::Header::try_from(head.as_slice())
            .map_err(|e| HeaderError::Malformed(e.to_string()))?;
        return Ok(match (header.command, header.addresses) {
            (v2::Command::Local, _) => None,
            (_, v2::Addresses::IPv4(a)) => {
                Some(SocketAddr::from((a.source_address, a.source_port)))
            }
            (_, v2::Addresses::IPv6(a)) => {
                Some(SocketAddr::from((a.source_address, a.source_port)))
            }
            _ => None,
        });
    }
    if !head.starts_with(b"PROXY ") {
        return Err(HeaderError::Missing);
    }
    if !head.ends_with(b"\r\n") {
        read_v1_rest(stream, &mut head).await?;
    }
    let header = ppp::v1::Header::try_from(head.as_slice())
        .map_err(|e| HeaderError::Malformed(e.to_string()))?;
    Ok(match header.addresses {
        ppp::v1::Addresses::Tcp4(a) => Some(SocketAddr::from((a.source_address, a.source_port))),
        ppp::v1::Addresses::Tcp6(a) => Some(SocketAddr::from((a.source_address, a.source_port))),
        ppp::v1::Addresses::Unknown => None,
    })
}

/// The rest of a v1 header, up to and including its CRLF: looked at
/// without taking it (`peek`), then taken exactly. A header still
/// arriving is looked at again after a short pause (a proxy writes it at
/// once; the caller's timeout bounds the wait).
async fn read_v1_rest(stream: &mut TcpStream, head: &mut Vec<u8>) -> Result<(), HeaderError> {
    let mut window = [0u8; V1_LONGEST - V1_SHORTEST];
    loop {
        let seen = stream.peek(&mut window).await?;
        if seen == 0 {
            return Err(HeaderError::Malformed("closed inside the header".into()));
        }
        // The CR may have been the last byte of what was read already.
        let end = if head.last() == Some(&b'\r') && window[0] == b'\n' {
            Some(1)
        } else {
            memchr::memmem::find(&window[..seen], b"\r\n").map(|at| at + 2)
        };
        if let Some(end) = end {
            let start = head.len();
            head.resize(start + end, 0);
            stream.read_exact(&mut head[start..]).await?;
            return Ok(());
        }
        if seen == window.len() {
            return Err(HeaderError::Malformed(format!(
                "no end of line within {V1_LONGEST} bytes"
            )));
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    use crate::backends::ProxyHeader;
    use crate::plan::ProxyProtocol;

    fn addr(text: &str) -> SocketAddr {
        text.parse().expect("address")
    }

    fn header(version: ProxyProtocol, client: SocketAddr, local: SocketAddr) -> Vec<u8> {
        ProxyHeader {
            version,
            client,
            local,
        }
        .bytes()
    }

    async fn read_from(bytes: Vec<Vec<u8>>) -> (Result<Option<SocketAddr>, HeaderError>, Vec<u8>) {
        let (mut server, writer) = crate::proxy::test_io::sent_in_pieces(bytes, true).await;
        let read = read(&mut server, Duration::from_secs(2)).await;
        let mut rest = Vec::new();
        if read.is_ok() {
            server.read_to_end(&mut rest).await.expect("rest");
        }
        writer.await.expect("writer");
        (read, rest)
    }

    #[tokio::test]
    async fn reads_exactly_the_header_in_one_piece_or_several() {
        let v1 = header(
            ProxyProtocol::V1,
            addr("192.0.2.7:4000"),
            addr("127.0.0.1:80"),
        );
        let (got, rest) = read_from(vec![[v1.as_slice(), b"payload"].concat()]).await;
        assert_eq!(got.expect("v1"), Some(addr("192.0.2.7:4000")));
        assert_eq!(rest, b"payload");
        // Split in the middle, and right between CR and LF.
        let cut = v1.len() - 1;
        let (got, rest) = read_from(vec![
            v1[..20].to_vec(),
            v1[20..cut].to_vec(),
            [&v1[cut..], b"x"].concat(),
        ])
        .await;
        assert_eq!(got.expect("split v1"), Some(addr("192.0.2.7:4000")));
        assert_eq!(rest, b"x");
        let v2 = header(
            ProxyProtocol::V2,
            addr("[2001:db8::1]:4000"),
            addr("[::1]:80"),
        );
        let (got, rest) = read_from(vec![v2[..10].to_vec(), [&v2[10..], b"after"].concat()]).await;
        assert_eq!(got.expect("v2"), Some(addr("[2001:db8::1]:4000")));
        assert_eq!(rest, b"after");
        let (got, rest) = read_from(vec![b"PROXY UNKNOWN\r\nhello".to_vec()]).await;
        assert_eq!(got.expect("unknown"), None);
        assert_eq!(rest, b"hello");
    }

    #[tokio::test]
    async fn refuses_what_is_not_a_header() {
        let (got, _) = read_from(vec![b"GET / HTTP/1.1\r\nHost: x\r\n\r\n".to_vec()]).await;
        assert!(matches!(got, Err(HeaderError::Missing)), "{got:?}");
        let (got, _) = read_from(vec![b"PROXY TCP4 999.0.0.1 1.1.1.1 1 2\r\n".to_vec()]).await;
        assert!(matches!(got, Err(HeaderError::Malformed(_))), "{got:?}");
        let (got, _) = read_from(vec![[b"PROXY TCP4 ".as_slice(), &[b'1'; 120]].concat()]).await;
        assert!(matches!(got, Err(HeaderError::Malformed(_))), "{got:?}");
    }
}
