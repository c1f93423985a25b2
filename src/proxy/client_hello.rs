//! Reading a TLS ClientHello without terminating TLS (SNI pass-through):
//! rustls's `Acceptor` parses it; every byte read is kept, to be sent on
//! to the upstream that the server name chooses.

use std::time::Duration;

use tokio::io::AsyncReadExt;
use tokio::net::TcpStream;

/// A ClientHello as read off a connection.
pub struct Hello {
    /// Every byte read so far, the ClientHello and anything after it.
    pub bytes: Vec<u8>,
    /// Lower-cased.
    pub server_name: Option<String>,
    pub alpn: Vec<Vec<u8>>,
}

#[derive(Debug, thiserror::Error)]
pub enum HelloError {
    #[error("no ClientHello within {0:?}")]
    Timeout(Duration),
    #[error("the first byte is not a TLS handshake record")]
    NotTls,
    #[error("closed before the ClientHello was complete")]
    Closed,
    #[error("malformed ClientHello: {0}")]
    Malformed(String),
    #[error(transparent)]
    Io(#[from] std::io::Error),
}

/// Largest ClientHello taken (several records' worth; post-quantum key
/// shares make them 1-2 KiB, and the record limit is 16 KiB).
const MAX_HELLO: usize = 64 * 1024;

/// What one read asks for at most.
const READ_CHUNK: usize = 4096;

/// Reads the connection's ClientHello, however many segments and records
/// it comes in, within `timeout`.
pub async fn read(stream: &mut TcpStream, timeout: Duration) -> Result<Hello, HelloError> {
    tokio::time::timeout(timeout, read_hello(stream))
        .await
        .map_err(|_| HelloError::Timeout(timeout))?
}

async fn read_hello(stream: &mut TcpStream) -> Result<Hello, HelloError> {
    let mut acceptor = rustls::server::Acceptor::default();
    // Read straight into what is kept: no buffer on the future's stack
    // (every L4 connection's task is as large as its largest state).
    let mut bytes = Vec::with_capacity(READ_CHUNK);
    loop {
        let start = bytes.len();
        bytes.reserve(READ_CHUNK);
        let n = stream.read_buf(&mut bytes).await?;
        if n == 0 {
            return Err(HelloError::Closed);
        }
        // 22: a handshake record. Anything else is not TLS (or is not
        // starting with a ClientHello): closed at the first byte.
        if start == 0 && bytes.first() != Some(&22) {
            return Err(HelloError::NotTls);
        }
        if bytes.len() > MAX_HELLO {
            return Err(HelloError::Malformed(format!(
                "longer than {MAX_HELLO} bytes"
            )));
        }
        let mut fresh = bytes.get(start..).unwrap_or_default();
        while !fresh.is_empty() {
            if acceptor.read_tls(&mut fresh)? == 0 {
                return Err(HelloError::Malformed(
                    "more than one ClientHello's worth".into(),
                ));
            }
        }
        match acceptor.accept() {
            Ok(None) => continue,
            Ok(Some(accepted)) => {
                let hello = accepted.client_hello();
                return Ok(Hello {
                    server_name: hello.server_name().map(str::to_ascii_lowercase),
                    alpn: hello
                        .alpn()
                        .map(|protocols| protocols.map(<[u8]>::to_vec).collect())
                        .unwrap_or_default(),
                    bytes,
                });
            }
            Err((error, _)) => return Err(HelloError::Malformed(error.to_string())),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    /// The first flight of a rustls client for `name` offering `alpn`.
    fn client_hello(name: &str, alpn: &[&[u8]]) -> Vec<u8> {
        let mut config = rustls::ClientConfig::builder_with_provider(Arc::new(
            rustls::crypto::ring::default_provider(),
        ))
        .with_safe_default_protocol_versions()
        .expect("versions")
        .with_root_certificates(rustls::RootCertStore::empty())
        .with_no_client_auth();
        config.alpn_protocols = alpn.iter().map(|p| p.to_vec()).collect();
        let name = rustls::pki_types::ServerName::try_from(name.to_owned()).expect("name");
        let mut conn = rustls::ClientConnection::new(Arc::new(config), name).expect("client");
        let mut out = Vec::new();
        while conn.wants_write() {
            conn.write_tls(&mut out).expect("write_tls");
        }
        out
    }

    /// Sends `chunks` (pausing between them, so that they arrive as
    /// separate segments) and reads a ClientHello off the other end.
    async fn read_chunks(chunks: Vec<Vec<u8>>, timeout: Duration) -> Result<Hello, HelloError> {
        // Held open: the reader decides when it is done.
        let (mut server, writer) = crate::proxy::test_io::sent_in_pieces(chunks, false).await;
        let read = read(&mut server, timeout).await;
        writer.abort();
        read
    }

    #[tokio::test]
    async fn reads_name_and_alpn_and_keeps_every_byte_however_it_is_split() {
        let hello = client_hello("DB.example.com", &[b"postgresql", b"h2"]);
        let whole = read_chunks(vec![hello.clone()], Duration::from_secs(2))
            .await
            .expect("whole");
        assert_eq!(whole.server_name.as_deref(), Some("db.example.com"));
        assert_eq!(whole.alpn, vec![b"postgresql".to_vec(), b"h2".to_vec()]);
        assert_eq!(whole.bytes, hello);
        // In three segments: the record header alone, then the rest.
        let split = read_chunks(
            vec![
                hello[..3].to_vec(),
                hello[3..100].to_vec(),
                hello[100..].to_vec(),
            ],
            Duration::from_secs(2),
        )
        .await
        .expect("split");
        assert_eq!(split.server_name.as_deref(), Some("db.example.com"));
        assert_eq!(split.bytes, hello);
    }

    #[tokio::test]
    async fn refuses_silence_plain_text_and_garbage() {
        let started = std::time::Instant::now();
        let silent = read_chunks(Vec::new(), Duration::from_millis(300)).await;
        assert!(
            matches!(silent, Err(HelloError::Timeout(_))),
            "{:?}",
            silent.err()
        );
        assert!(started.elapsed() < Duration::from_secs(1));
        let plain = read_chunks(
            vec![b"GET / HTTP/1.1\r\n\r\n".to_vec()],
            Duration::from_secs(2),
        )
        .await;
        assert!(
            matches!(plain, Err(HelloError::NotTls)),
            "{:?}",
            plain.err()
        );
        let garbage = read_chunks(
            vec![vec![22, 3, 1, 0, 4, 9, 9, 9, 9]],
            Duration::from_secs(2),
        )
        .await;
        assert!(
            matches!(garbage, Err(HelloError::Malformed(_))),
            "{:?}",
            garbage.err()
        );
    }
}
