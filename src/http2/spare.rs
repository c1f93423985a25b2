//! Spare I/O buffers, kept per thread: a server connection holds its
//! read and write buffers only while it has bytes to move, and gives
//! them back here when it goes idle or ends, as HAProxy's and nginx's
//! buffer pools do. Thousands of idle keep-alive connections then hold
//! no buffer each; a busy one takes one from the worker's spares (a pop
//! from a `Vec`, no allocation) and gives it back at rest.
//!
//! A buffer still shared with a frame's payload (a body chunk not read
//! yet) is not kept: it goes when its last piece does.

use std::cell::RefCell;

use bytes::BytesMut;

/// The size of a buffer: a frame of the default SETTINGS_MAX_FRAME_SIZE
/// and its header fit in one read.
pub(super) const SIZE: usize = 16 * 1024;

/// How many spares a thread keeps (16 KiB each): enough for the
/// connections that go busy and idle in turn on one worker; past it, a
/// buffer given back is freed.
const KEEP: usize = 32;

thread_local! {
    static SPARES: RefCell<Vec<BytesMut>> = const { RefCell::new(Vec::new()) };
}

// Every access is `try_with`: a connection dropped while its thread
// ends (after the spares are gone) takes or keeps nothing, never panics.

/// An empty buffer of at least `SIZE` bytes: a spare, or a new one.
pub(super) fn take() -> BytesMut {
    SPARES
        .try_with(|spares| spares.borrow_mut().pop())
        .ok()
        .flatten()
        .unwrap_or_else(|| BytesMut::with_capacity(SIZE))
}

/// Two of them (a connection's read and write buffers), with one look
/// at the thread's spares.
pub(super) fn take_two() -> (BytesMut, BytesMut) {
    let (first, second) = SPARES
        .try_with(|spares| {
            let mut spares = spares.borrow_mut();
            (spares.pop(), spares.pop())
        })
        .unwrap_or((None, None));
    let new = || BytesMut::with_capacity(SIZE);
    (first.unwrap_or_else(new), second.unwrap_or_else(new))
}

/// Gives both buffers back, leaving empty ones without an allocation in
/// their place (freed, when the thread keeps no more).
pub(super) fn give_two(first: &mut BytesMut, second: &mut BytesMut) {
    let kept = SPARES.try_with(|spares| {
        let mut spares = spares.borrow_mut();
        keep(&mut spares, first);
        keep(&mut spares, second);
    });
    if kept.is_err() {
        *first = BytesMut::new();
        *second = BytesMut::new();
    }
}

/// Keeps `buffer`, emptied, if there is room among the spares and it has
/// room for `SIZE` again at its start: not when a payload still shares
/// it, nor when it grew past 4 × `SIZE` for a large header block.
#[inline(always)]
fn keep(spares: &mut Vec<BytesMut>, buffer: &mut BytesMut) {
    let mut buffer = std::mem::take(buffer);
    buffer.clear();
    if spares.len() < KEEP && buffer.capacity() <= 4 * SIZE && buffer.try_reclaim(SIZE) {
        spares.push(buffer);
    }
}

/// How many spares this thread keeps now.
#[cfg(test)]
pub(super) fn held() -> usize {
    SPARES.with(|spares| spares.borrow().len())
}

#[cfg(test)]
mod tests {
    use super::*;
    use bytes::BufMut;

    use super::held as spares;

    #[test]
    fn a_buffer_given_back_is_taken_again_without_an_allocation() {
        let mut buffer = take();
        buffer.put_slice(b"frame");
        let at = buffer.as_ptr();
        let before = spares();
        give_two(&mut buffer, &mut BytesMut::new());
        assert_eq!(buffer.capacity(), 0, "the connection keeps no buffer");
        assert_eq!(spares(), before + 1, "an empty one is not kept");
        let again = take();
        assert_eq!(again.as_ptr(), at, "the same allocation, from its start");
        assert!(again.is_empty() && again.capacity() >= SIZE);
        let (mut read, mut write) = take_two();
        let (r, w) = (read.as_ptr(), write.as_ptr());
        give_two(&mut read, &mut write);
        let (read, write) = take_two();
        assert_eq!(
            (read.as_ptr(), write.as_ptr()),
            (w, r),
            "both, from the spares"
        );
    }

    #[test]
    fn a_buffer_a_payload_still_shares_is_not_kept() {
        let mut buffer = take();
        buffer.put_slice(&[7; 100]);
        let payload = buffer.split_to(100).freeze();
        let before = spares();
        give_two(&mut buffer, &mut BytesMut::new());
        assert_eq!(spares(), before, "not kept while a payload points into it");
        assert_eq!(&payload[..], &[7; 100][..]);
        // Once the payload is gone the next buffer is whole again.
        drop(payload);
        let mut other = take();
        other.put_slice(&[1; 10]);
        let _ = other.split_to(10);
        give_two(&mut other, &mut BytesMut::new());
        assert_eq!(spares(), before + 1, "unique again: room reclaimed");
    }

    #[test]
    fn buffers_given_back_while_their_thread_ends_are_freed_without_a_panic() {
        // A connection dropped by a thread-local's destructor after the
        // spares' own has run (destructors run in the reverse order of
        // first use). A panic there would abort the test binary.
        struct Late(BytesMut, BytesMut);
        impl Drop for Late {
            fn drop(&mut self) {
                give_two(&mut self.0, &mut self.1);
                assert_eq!((self.0.capacity(), self.1.capacity()), (0, 0));
            }
        }
        thread_local! {
            static LATE: RefCell<Option<Late>> = const { RefCell::new(None) };
        }
        std::thread::spawn(|| {
            LATE.with(|late| *late.borrow_mut() = Some(Late(BytesMut::new(), BytesMut::new())));
            let (read, write) = take_two();
            LATE.with(|late| *late.borrow_mut() = Some(Late(read, write)));
        })
        .join()
        .expect("the thread ended without a panic");
    }

    #[test]
    fn a_thread_keeps_at_most_its_share() {
        let mut taken: Vec<BytesMut> = (0..KEEP + 8).map(|_| take()).collect();
        for pair in taken.chunks_mut(2) {
            if let [first, second] = pair {
                give_two(first, second);
            }
        }
        assert_eq!(spares(), KEEP);
    }
}
