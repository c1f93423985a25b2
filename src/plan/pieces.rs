//! What a later candidate may take over from the active configuration
//! (`validate::reuse`).

use std::sync::Arc;

use super::Digest;

/// Where a configuration's routes and upstreams came from, so that a later
/// candidate can take over what it did not change (issue "scale"): a
/// route whose source piece, files and context are those of the active
/// configuration keeps its validated spec, canonical text and compiled
/// route (the same allocations); an upstream keeps its compiled upstream.
#[derive(Debug, Clone, Default)]
pub struct Pieces {
    /// Aligned with `routes` (and `file.routes`); empty when the text was
    /// not cut into pieces (`config::segments`).
    pub routes: Vec<Piece>,
    /// By upstream name; empty when the text was not cut into pieces.
    pub upstreams: std::collections::HashMap<String, Piece>,
    /// What a route's validation reads besides its own piece and files:
    /// the listeners' names and protocols, the upstreams' names, protocols
    /// and TLS, where files are read from.
    pub route_context: Digest,
    /// The text and where its pieces are, when it was cut: the next
    /// candidate is cut only where it differs from it.
    pub cut: Option<Arc<crate::config::segments::Cut>>,
}

/// One route's or upstream's source: the digest of its text as written,
/// and of each file its validation read (by the name the text gives).
#[derive(Debug, Clone, PartialEq)]
pub struct Piece {
    pub text: Digest,
    pub files: Vec<(String, Digest)>,
}
