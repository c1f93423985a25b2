//! The streaming compressor (DESIGN §17): a response body compressed as
//! it passes, never held whole. What the backend sends is fed to the
//! encoder as it comes; compressed bytes go out once there are enough of
//! them, and whenever the backend pauses (so a server-sent event is not
//! held back waiting for the next), and the stream is finished when the
//! backend's is. A client that stops reading stops the polling, and so
//! the reading from the backend: memory stays the encoder's window and
//! one frame. The gateway only ever encodes; it never decodes a body.

use std::io::Write;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use bytes::Bytes;
use http::HeaderMap;
use http_body::{Body, Frame, SizeHint};

use crate::plan::{Encoding, Level};
use crate::telemetry::access::Trail;

type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// Compressed bytes worth a frame of their own.
const EMIT: usize = 16 * 1024;
/// Input taken in one poll before the task yields (a body that
/// compresses to nearly nothing must not hold the worker).
const BUDGET: usize = 256 * 1024;
/// Windows above this are not used whatever the level: a stream's memory
/// is bounded (zstd and brotli would take up to 8 and 4 MiB by default).
const MAX_WINDOW_LOG: u32 = 20;

/// One encoder, writing into its own buffer.
pub struct Encoder {
    codec: Codec,
}

enum Codec {
    Gzip(flate2::write::GzEncoder<Vec<u8>>),
    /// `None` once finished (brotli's writer finishes by being consumed);
    /// the last bytes then wait in `.1`.
    Brotli(Option<Box<brotli::CompressorWriter<Vec<u8>>>>, Vec<u8>),
    Zstd(zstd::stream::write::Encoder<'static, Vec<u8>>),
}

impl Encoder {
    /// An encoder for a body of `length` bytes when that is known (the
    /// encoders size their tables and window to it).
    pub fn new(encoding: Encoding, level: Level, length: Option<u64>) -> std::io::Result<Self> {
        let quality = level.of(encoding);
        // The smallest window that holds the whole body, when its length
        // is known.
        let window = length.map_or(MAX_WINDOW_LOG, |n| {
            (u64::BITS - n.max(1).leading_zeros()).clamp(10, MAX_WINDOW_LOG)
        });
        let codec = match encoding {
            Encoding::Gzip => Codec::Gzip(flate2::write::GzEncoder::new(
                Vec::new(),
                flate2::Compression::new(quality.unsigned_abs()),
            )),
            Encoding::Brotli => {
                let params = brotli::enc::BrotliEncoderParams {
                    quality,
                    lgwin: i32::try_from(window).unwrap_or(20),
                    size_hint: length.and_then(|n| usize::try_from(n).ok()).unwrap_or(0),
                    ..Default::default()
                };
                let writer = brotli::CompressorWriter::with_params(Vec::new(), 4096, &params);
                Codec::Brotli(Some(Box::new(writer)), Vec::new())
            }
            Encoding::Zstd => {
                let mut encoder = zstd::stream::write::Encoder::new(Vec::new(), quality)?;
                encoder.window_log(window)?;
                if let Some(n) = length {
                    encoder.set_pledged_src_size(Some(n))?;
                }
                Codec::Zstd(encoder)
            }
        };
        Ok(Encoder { codec })
    }

    pub fn write(&mut self, data: &[u8]) -> std::io::Result<()> {
        match &mut self.codec {
            Codec::Gzip(w) => w.write_all(data),
            Codec::Brotli(Some(w), _) => w.write_all(data),
            Codec::Brotli(None, _) => Err(finished()),
            Codec::Zstd(w) => w.write_all(data),
        }
    }

    /// Everything written so far becomes decodable by the client.
    pub fn flush(&mut self) -> std::io::Result<()> {
        match &mut self.codec {
            Codec::Gzip(w) => w.flush(),
            Codec::Brotli(Some(w), _) => w.flush(),
            Codec::Brotli(None, _) => Ok(()),
            Codec::Zstd(w) => w.flush(),
        }
    }

    /// The stream's end (its checksum, its last block).
    pub fn finish(&mut self) -> std::io::Result<()> {
        match &mut self.codec {
            Codec::Gzip(w) => w.try_finish(),
            Codec::Brotli(writer, done) => {
                if let Some(w) = writer.take() {
                    let mut last = w.into_inner();
                    done.append(&mut last);
                }
                Ok(())
            }
            Codec::Zstd(w) => w.do_finish(),
        }
    }

    /// Compressed bytes ready to go.
    pub fn ready(&self) -> usize {
        match &self.codec {
            Codec::Gzip(w) => w.get_ref().len(),
            Codec::Brotli(Some(w), done) => w.get_ref().len() + done.len(),
            Codec::Brotli(None, done) => done.len(),
            Codec::Zstd(w) => w.get_ref().len(),
        }
    }

    /// Takes the compressed bytes ready to go.
    pub fn take(&mut self) -> Bytes {
        let out = match &mut self.codec {
            Codec::Gzip(w) => std::mem::take(w.get_mut()),
            Codec::Brotli(Some(w), _) => std::mem::take(w.get_mut()),
            Codec::Brotli(None, done) => std::mem::take(done),
            Codec::Zstd(w) => std::mem::take(w.get_mut()),
        };
        Bytes::from(out)
    }
}

fn finished() -> std::io::Error {
    std::io::Error::other("the compressed stream is already finished")
}

/// A body compressed as it streams.
pub struct Compressing<B> {
    inner: B,
    /// `None` once the stream is finished (or broken).
    encoder: Option<Encoder>,
    /// Input since the last flush.
    dirty: bool,
    /// The backend's trailers, sent after the last compressed bytes.
    trailers: Option<HeaderMap>,
    /// The request's trail (when its line is logged): the bytes before
    /// compression.
    trail: Option<Arc<Trail>>,
}

impl<B> Compressing<B> {
    pub fn new(inner: B, encoder: Encoder, trail: Option<Arc<Trail>>) -> Self {
        Compressing {
            inner,
            encoder: Some(encoder),
            dirty: false,
            trailers: None,
            trail,
        }
    }

    pub fn inner_mut(&mut self) -> &mut B {
        &mut self.inner
    }

    /// The stream's last bytes.
    fn finish(&mut self) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        let Some(mut encoder) = self.encoder.take() else {
            return Poll::Ready(self.trailers.take().map(|t| Ok(Frame::trailers(t))));
        };
        if let Err(error) = encoder.finish() {
            return Poll::Ready(Some(Err(Box::new(error))));
        }
        let last = encoder.take();
        if last.is_empty() {
            return Poll::Ready(self.trailers.take().map(|t| Ok(Frame::trailers(t))));
        }
        Poll::Ready(Some(Ok(Frame::data(last))))
    }
}

impl<B> Body for Compressing<B>
where
    B: Body<Data = Bytes> + Unpin,
    B::Error: Into<BoxError>,
{
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        let this = self.get_mut();
        let mut taken = 0;
        loop {
            let Some(encoder) = this.encoder.as_mut() else {
                return Poll::Ready(this.trailers.take().map(|t| Ok(Frame::trailers(t))));
            };
            match Pin::new(&mut this.inner).poll_frame(cx) {
                Poll::Ready(Some(Ok(frame))) => {
                    let data = match frame.into_data() {
                        Ok(data) => data,
                        Err(frame) => {
                            // Trailers end the body: they follow its last
                            // compressed bytes.
                            this.trailers = frame.into_trailers().ok();
                            return this.finish();
                        }
                    };
                    if let Some(trail) = &this.trail {
                        trail.add_uncompressed(data.len());
                    }
                    if let Err(error) = encoder.write(&data) {
                        this.encoder = None;
                        return Poll::Ready(Some(Err(Box::new(error))));
                    }
                    this.dirty = true;
                    taken += data.len();
                    if encoder.ready() >= EMIT {
                        return Poll::Ready(Some(Ok(Frame::data(encoder.take()))));
                    }
                    if taken >= BUDGET {
                        cx.waker().wake_by_ref();
                        return Poll::Pending;
                    }
                }
                Poll::Ready(Some(Err(error))) => {
                    this.encoder = None;
                    return Poll::Ready(Some(Err(error.into())));
                }
                Poll::Ready(None) => return this.finish(),
                // The backend paused: what it sent so far goes out now.
                Poll::Pending => {
                    if std::mem::take(&mut this.dirty) {
                        if let Err(error) = encoder.flush() {
                            this.encoder = None;
                            return Poll::Ready(Some(Err(Box::new(error))));
                        }
                    }
                    if encoder.ready() > 0 {
                        return Poll::Ready(Some(Ok(Frame::data(encoder.take()))));
                    }
                    return Poll::Pending;
                }
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        self.encoder.is_none() && self.trailers.is_none()
    }

    fn size_hint(&self) -> SizeHint {
        // Unknown: the length is the encoder's to find out.
        SizeHint::default()
    }
}

impl<B> std::fmt::Debug for Compressing<B> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Compressing")
            .field("finished", &self.encoder.is_none())
            .finish()
    }
}
