//! The PROXY protocol header (HAProxy's, v1 text and v2 binary) a
//! backend connection starts with, so that the backend sees the client's
//! address; written by the `ppp` crate.

use std::net::{IpAddr, SocketAddr};

use ppp::v2;

use super::ProxyHeader;
use crate::plan::ProxyProtocol;

impl ProxyHeader {
    /// The header telling a backend that `client` connected to `local`.
    /// Mixed families are both written as IPv6 (an IPv4 address as
    /// `::ffff:a.b.c.d`), since a header carries one.
    pub fn bytes(&self) -> Vec<u8> {
        let (client, local) = match (self.client, self.local) {
            (client @ SocketAddr::V4(_), local @ SocketAddr::V6(_)) => (as_v6(client), local),
            (client @ SocketAddr::V6(_), local @ SocketAddr::V4(_)) => (client, as_v6(local)),
            same => same,
        };
        match self.version {
            ProxyProtocol::V1 => ppp::v1::Addresses::from((client, local))
                .to_string()
                .into_bytes(),
            ProxyProtocol::V2 => v2::Builder::with_addresses(
                v2::Version::Two | v2::Command::Proxy,
                v2::Protocol::Stream,
                (client, local),
            )
            .build()
            // Only writes into a Vec: it cannot fail for two socket
            // addresses.
            .unwrap_or_default(),
        }
    }
}

fn as_v6(address: SocketAddr) -> SocketAddr {
    match address.ip() {
        IpAddr::V4(ip) => SocketAddr::new(IpAddr::V6(ip.to_ipv6_mapped()), address.port()),
        IpAddr::V6(_) => address,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const V2_SIGNATURE: &[u8; 12] = b"\r\n\r\n\0\r\nQUIT\n";

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

    #[test]
    fn headers_are_byte_exact_for_both_versions_and_families() {
        let v1 = header(
            ProxyProtocol::V1,
            addr("127.0.0.1:51000"),
            addr("127.0.0.1:443"),
        );
        assert_eq!(v1, b"PROXY TCP4 127.0.0.1 127.0.0.1 51000 443\r\n");
        let v1 = header(ProxyProtocol::V1, addr("[::1]:51000"), addr("[::1]:443"));
        assert_eq!(v1, b"PROXY TCP6 ::1 ::1 51000 443\r\n");
        let v2 = header(
            ProxyProtocol::V2,
            addr("127.0.0.1:51000"),
            addr("10.0.0.1:443"),
        );
        let mut expected = V2_SIGNATURE.to_vec();
        expected.extend([0x21, 0x11, 0, 12, 127, 0, 0, 1, 10, 0, 0, 1]);
        expected.extend(51000u16.to_be_bytes());
        expected.extend(443u16.to_be_bytes());
        assert_eq!(v2, expected);
        let v2 = header(ProxyProtocol::V2, addr("[::1]:51000"), addr("[::1]:443"));
        assert_eq!(&v2[12..16], &[0x21, 0x21, 0, 36]);
        assert_eq!(v2.len(), 16 + 36);
        // An IPv4 client on an IPv6 listener: both as IPv6.
        let v1 = header(ProxyProtocol::V1, addr("127.0.0.1:5"), addr("[::1]:443"));
        assert_eq!(v1, b"PROXY TCP6 ::ffff:127.0.0.1 ::1 5 443\r\n");
    }
}
