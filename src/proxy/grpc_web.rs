//! gRPC-Web (route `grpc_web = true`): a browser's call, binary
//! (`application/grpc-web…`) or base64 text (`application/grpc-web-text…`),
//! goes to the backend as plain gRPC over HTTP/2; its answer comes back in
//! the call's own encoding, the trailers as gRPC-Web's trailer frame (a
//! message whose flag byte has the high bit set) because a browser cannot
//! read HTTP trailers. Both directions stream: text is decoded and
//! encoded in whole base64 quanta, with at most three bytes held back.

use std::pin::Pin;
use std::task::{Context, Poll};

use base64::Engine as _;
use bytes::{BufMut, Bytes, BytesMut};
use http::header::{self, HeaderMap, HeaderValue};
use http::Request;
use http_body::{Body, Frame, SizeHint};

use crate::backends::ClientBody;

const WEB: &str = "application/grpc-web";
const WEB_TEXT: &str = "application/grpc-web-text";
const GRPC: &str = "application/grpc";

/// How a gRPC-Web call's messages are written.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    Binary,
    Text,
}

/// The mode of a gRPC-Web request, and what follows the media type
/// (`+proto`, parameters), if it is one.
fn mode_of(headers: &HeaderMap) -> Option<(Mode, &str)> {
    let content_type = headers.get(header::CONTENT_TYPE)?.to_str().ok()?;
    if let Some(rest) = content_type.strip_prefix(WEB_TEXT) {
        return Some((Mode::Text, rest));
    }
    content_type
        .strip_prefix(WEB)
        .map(|rest| (Mode::Binary, rest))
}

/// Turns a gRPC-Web request into the gRPC request the backend is sent;
/// `None` (and the request untouched) when it is not gRPC-Web.
pub fn translate(req: Request<ClientBody>) -> (Request<ClientBody>, Option<Mode>) {
    let Some((mode, rest)) = mode_of(req.headers()) else {
        return (req, None);
    };
    let Ok(content_type) = HeaderValue::try_from(format!("{GRPC}{rest}")) else {
        return (req, None);
    };
    let (mut parts, body) = req.into_parts();
    parts.headers.insert(header::CONTENT_TYPE, content_type);
    parts
        .headers
        .insert(header::TE, HeaderValue::from_static("trailers"));
    let body = match mode {
        Mode::Binary => body,
        Mode::Text => {
            // Decoding changes the length.
            parts.headers.remove(header::CONTENT_LENGTH);
            ClientBody::Other(Box::pin(TextDecoder {
                inner: body,
                carry: Vec::new(),
            }))
        }
    };
    (Request::from_parts(parts, body), Some(mode))
}

/// A gRPC answer's head, rewritten for the gRPC-Web client.
pub fn answer_head(headers: &mut HeaderMap, mode: Mode) {
    let web = match mode {
        Mode::Binary => WEB,
        Mode::Text => WEB_TEXT,
    };
    let translated = headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix(GRPC))
        .and_then(|rest| HeaderValue::try_from(format!("{web}{rest}")).ok());
    if let Some(content_type) = translated {
        headers.insert(header::CONTENT_TYPE, content_type);
    }
    // The trailer frame (and base64) change the length.
    headers.remove(header::CONTENT_LENGTH);
}

/// Writes an answer's messages and trailers in the call's mode.
#[derive(Debug)]
pub struct Encoder {
    mode: Mode,
    /// Text mode: bytes not yet a whole base64 quantum (at most two).
    carry: BytesMut,
}

impl Encoder {
    pub fn new(mode: Mode) -> Self {
        Self {
            mode,
            carry: BytesMut::new(),
        }
    }

    pub fn data(&mut self, data: Bytes) -> Bytes {
        if self.mode == Mode::Binary {
            return data;
        }
        self.carry.extend_from_slice(&data);
        let whole = self.carry.len() / 3 * 3;
        let quanta = self.carry.split_to(whole);
        Bytes::from(base64::engine::general_purpose::STANDARD.encode(quanta))
    }

    /// The trailer frame, after whatever text was held back.
    pub fn trailers(&mut self, trailers: &HeaderMap) -> Bytes {
        let mut block = Vec::new();
        for (name, value) in trailers {
            block.extend_from_slice(name.as_str().as_bytes());
            block.extend_from_slice(b": ");
            block.extend_from_slice(value.as_bytes());
            block.extend_from_slice(b"\r\n");
        }
        let mut frame = BytesMut::with_capacity(5 + block.len());
        frame.put_u8(0x80);
        frame.put_u32(u32::try_from(block.len()).unwrap_or(u32::MAX));
        frame.put_slice(&block);
        match self.mode {
            Mode::Binary => frame.freeze(),
            Mode::Text => {
                let mut out = self.finish().map(Vec::from).unwrap_or_default();
                out.extend_from_slice(
                    base64::engine::general_purpose::STANDARD
                        .encode(&frame)
                        .as_bytes(),
                );
                Bytes::from(out)
            }
        }
    }

    /// What was held back, padded, at the end of the answer.
    pub fn finish(&mut self) -> Option<Bytes> {
        if self.carry.is_empty() {
            return None;
        }
        let rest = self.carry.split();
        Some(Bytes::from(
            base64::engine::general_purpose::STANDARD.encode(rest),
        ))
    }
}

/// A `grpc-web-text` request body, decoded as it arrives. Each padded
/// quantum ends a piece of its own: clients may send padded chunks one
/// after another.
struct TextDecoder {
    inner: ClientBody,
    carry: Vec<u8>,
}

/// A `grpc-web-text` body that is not base64.
#[derive(Debug, thiserror::Error)]
#[error("grpc-web-text body is not base64")]
pub struct NotBase64;

type BoxError = Box<dyn std::error::Error + Send + Sync>;

impl TextDecoder {
    fn decode(&mut self) -> Result<Bytes, NotBase64> {
        let whole = self.carry.len() / 4 * 4;
        let mut out = Vec::with_capacity(whole / 4 * 3);
        let mut start = 0;
        let engine = &base64::engine::general_purpose::STANDARD;
        for quantum in (0..whole).step_by(4) {
            if self.carry[quantum + 3] == b'=' {
                engine
                    .decode_vec(&self.carry[start..quantum + 4], &mut out)
                    .map_err(|_| NotBase64)?;
                start = quantum + 4;
            }
        }
        engine
            .decode_vec(&self.carry[start..whole], &mut out)
            .map_err(|_| NotBase64)?;
        self.carry.drain(..whole);
        Ok(Bytes::from(out))
    }
}

impl Body for TextDecoder {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        let this = self.get_mut();
        loop {
            return match Pin::new(&mut this.inner).poll_frame(cx) {
                Poll::Pending => Poll::Pending,
                Poll::Ready(None) if this.carry.is_empty() => Poll::Ready(None),
                Poll::Ready(None) => Poll::Ready(Some(Err(Box::new(NotBase64)))),
                Poll::Ready(Some(Err(error))) => Poll::Ready(Some(Err(error))),
                Poll::Ready(Some(Ok(frame))) => match frame.into_data() {
                    Ok(data) => {
                        this.carry.extend_from_slice(&data);
                        match this.decode() {
                            Ok(decoded) if decoded.is_empty() => continue,
                            Ok(decoded) => Poll::Ready(Some(Ok(Frame::data(decoded)))),
                            Err(error) => Poll::Ready(Some(Err(Box::new(error)))),
                        }
                    }
                    Err(frame) => Poll::Ready(Some(Ok(frame))),
                },
            };
        }
    }

    fn is_end_stream(&self) -> bool {
        self.carry.is_empty() && self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        SizeHint::default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use http_body_util::BodyExt;

    async fn text_body(chunks: &[&'static str]) -> ClientBody {
        let (mut sender, body) =
            http_body_util::channel::Channel::<Bytes, BoxError>::new(chunks.len().max(1));
        for chunk in chunks {
            sender
                .send_data(Bytes::from_static(chunk.as_bytes()))
                .await
                .unwrap();
        }
        ClientBody::Other(Box::pin(body))
    }

    async fn decoded(chunks: &[&'static str]) -> Result<Bytes, BoxError> {
        let req = Request::builder()
            .method("POST")
            .header("content-type", "application/grpc-web-text+proto")
            .header("content-length", "99")
            .body(text_body(chunks).await)
            .unwrap();
        let (req, mode) = translate(req);
        assert_eq!(mode, Some(Mode::Text));
        assert_eq!(req.headers()["content-type"], "application/grpc+proto");
        assert_eq!(req.headers()["te"], "trailers");
        assert!(req.headers().get("content-length").is_none());
        Ok(req.into_body().collect().await?.to_bytes())
    }

    #[tokio::test]
    async fn text_requests_decode_across_any_split_and_padded_pieces() {
        // "hello world" split inside a quantum, then a padded piece after
        // another padded piece.
        assert_eq!(
            decoded(&["aGVs", "bG8g", "d2", "9ybGQ="]).await.unwrap(),
            "hello world"
        );
        assert_eq!(decoded(&["YQ==Yg==", "Yw=="]).await.unwrap(), "abc");
        assert!(decoded(&["aGVsbG8"]).await.is_err(), "truncated");
        assert!(decoded(&["a*Vs"]).await.is_err(), "not base64");
    }

    #[test]
    fn answers_are_encoded_in_quanta_with_the_trailer_frame_last() {
        let mut trailers = HeaderMap::new();
        trailers.insert("grpc-status", HeaderValue::from_static("0"));
        let mut binary = Encoder::new(Mode::Binary);
        assert_eq!(binary.data(Bytes::from_static(b"abcd")), "abcd");
        let frame = binary.trailers(&trailers);
        assert_eq!(&frame[..5], &[0x80, 0, 0, 0, 16]);
        assert_eq!(&frame[5..], b"grpc-status: 0\r\n");

        let mut text = Encoder::new(Mode::Text);
        let mut out = Vec::new();
        for piece in ["ab", "cd", "e"] {
            out.extend_from_slice(&text.data(Bytes::from_static(piece.as_bytes())));
        }
        assert_eq!(out, b"YWJj", "only whole quanta before the end");
        out.extend_from_slice(&text.trailers(&trailers));
        let engine = &base64::engine::general_purpose::STANDARD;
        // "de" padded, then the trailer frame padded on its own.
        assert_eq!(&out[4..8], b"ZGU=");
        let frame = engine.decode(&out[8..]).unwrap();
        assert_eq!(
            frame,
            [&[0x80, 0, 0, 0, 16][..], b"grpc-status: 0\r\n"].concat()
        );
    }

    #[test]
    fn answer_heads_take_the_web_media_type() {
        let mut headers = HeaderMap::new();
        headers.insert(
            "content-type",
            HeaderValue::from_static("application/grpc+proto"),
        );
        headers.insert("content-length", HeaderValue::from_static("10"));
        answer_head(&mut headers, Mode::Text);
        assert_eq!(headers["content-type"], "application/grpc-web-text+proto");
        assert!(headers.get("content-length").is_none());
    }
}
