//! How the process holds its memory (`runtime.huge_pages`).

/// `runtime.huge_pages`: when the kernel may back the heap with 2 MiB
/// pages. They save a busy process TLB misses and cost an idle one
/// resident memory.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum HugePages {
    /// Held back until a second with `BUSY_PER_SECOND` answers, then
    /// allowed for good.
    #[default]
    Busy,
    Never,
    Always,
}

impl HugePages {
    pub fn parse(text: &str) -> Option<Self> {
        match text {
            "busy" => Some(Self::Busy),
            "never" => Some(Self::Never),
            "always" => Some(Self::Always),
            _ => None,
        }
    }
}
