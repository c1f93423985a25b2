//! Futures boxed where they are built. The ground floor: it imports
//! nothing of the crate.
//!
//! `Box::pin(make())` builds the value on the stack and then copies all
//! of it into the allocation: for a request's future that is its whole
//! size (4.5 KiB on HTTP/2, 6.8 KiB on HTTP/3) whatever little its first
//! state holds. Allocating first lets the compiler build the value in
//! the allocation itself (docs/performance.md).

use std::pin::Pin;

/// `Box::pin(make())`, with the allocation made before `make` runs.
#[inline(always)]
pub fn pin_in_place<T>(make: impl FnOnce() -> T) -> Pin<Box<T>> {
    let slot = Box::new_uninit();
    Box::into_pin(Box::write(slot, make()))
}

#[cfg(test)]
mod tests {
    use super::pin_in_place;

    #[test]
    fn the_value_made_is_the_value_boxed() {
        let boxed = pin_in_place(|| [7u8; 4096]);
        assert!(boxed.iter().all(|&b| b == 7));
        let text = pin_in_place(|| String::from("kept"));
        assert_eq!(&**text, "kept");
    }
}
