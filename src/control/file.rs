//! The configuration file the process was started with: where a
//! candidate without text is read from, what `runtime.write_back`
//! rewrites, and whether it still holds the active generation's text
//! (status asks every second: remembered while neither the file nor the
//! active generation changes).

use std::path::{Path, PathBuf};
use std::sync::{Mutex, OnceLock, PoisonError};
use std::time::SystemTime;

use crate::config::ConfigText;
use crate::ids::GenerationId;

/// How the configuration file's text becomes the text it activates.
pub type FileComposer = Box<dyn Fn(String) -> String + Send + Sync>;

/// The file, its composer and the last comparison with the active text.
pub(super) struct ConfigFile {
    path: PathBuf,
    /// What the configuration file makes when activated, when that is
    /// not the file itself (a fleet instance's file is composed with the
    /// shared document it serves): set once, by whoever composes it.
    composer: OnceLock<FileComposer>,
    /// The last answer of `matches`: the active generation, the file's
    /// length and modification time, and whether they matched.
    #[allow(clippy::type_complexity)]
    matched: Mutex<Option<(GenerationId, Option<(u64, Option<SystemTime>)>, bool)>>,
}

impl ConfigFile {
    pub(super) fn new(path: PathBuf) -> Self {
        Self {
            path,
            composer: OnceLock::new(),
            matched: Mutex::new(None),
        }
    }

    pub(super) fn path(&self) -> &Path {
        &self.path
    }

    /// Says how the file's text becomes the text it activates (once).
    pub(super) fn compose_with(&self, composer: FileComposer) {
        if self.composer.set(composer).is_err() {
            tracing::error!(
                "the configuration file's composer was set twice; the second is ignored"
            );
        }
    }

    /// The text the file makes when activated: itself, or in a fleet,
    /// composed with the shared document served.
    pub(super) fn as_planned_text(&self, file: String) -> String {
        match self.composer.get() {
            Some(compose) => compose(file),
            None => file,
        }
    }

    /// Whether the file's text is generation `active`'s (`active_text`,
    /// `None` before history has recorded it: then no, and nothing is
    /// remembered, as a remembered "no" would stand until the file or
    /// the generation changed).
    pub(super) fn matches(
        &self,
        active: GenerationId,
        active_text: impl FnOnce() -> Option<ConfigText>,
    ) -> bool {
        let stamp = std::fs::metadata(&self.path)
            .ok()
            .map(|m| (m.len(), m.modified().ok()));
        let mut seen = self.matched.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some((id, at, matches)) = &*seen {
            if *id == active && *at == stamp {
                return *matches;
            }
        }
        let Some(active_text) = active_text() else {
            return false;
        };
        let matches = stamp.is_some()
            && ConfigText::read(&self.path)
                .is_ok_and(|file| self.as_planned_text(file.text) == active_text.text);
        *seen = Some((active, stamp, matches));
        matches
    }

    /// Rewrites the file with `text`, the previous file kept as
    /// `FILE.bak` (`runtime.write_back`); a failure is logged, and status
    /// then says the file does not match.
    pub(super) fn write(&self, text: &ConfigText) {
        if std::fs::read_to_string(&self.path).is_ok_and(|file| file == text.text) {
            return;
        }
        let (Some(dir), Some(name)) = (
            self.path.parent(),
            self.path.file_name().and_then(|n| n.to_str()),
        ) else {
            return;
        };
        let dir = if dir.as_os_str().is_empty() {
            std::path::Path::new(".")
        } else {
            dir
        };
        let written = std::fs::copy(&self.path, dir.join(format!("{name}.bak")))
            .map(|_| ())
            .or_else(|e| match e.kind() {
                std::io::ErrorKind::NotFound => Ok(()),
                _ => Err(e),
            })
            .and_then(|()| {
                crate::files::write_atomically(dir, name, |out| {
                    std::io::Write::write_all(out, text.text.as_bytes())
                })
            });
        match written {
            Ok(()) => {
                tracing::info!(file = %self.path.display(), "write_back: the configuration file now holds the active generation")
            }
            Err(error) => {
                tracing::error!(file = %self.path.display(), %error, "write_back failed: the configuration file does not match the active generation")
            }
        }
    }
}
