//! Referenced files: read once, confined to the configuration's folder and
//! `runtime.file_roots`, kept for hashing.

use super::*;

impl Validator<'_> {
    /// Where file `name` is, and whether it is inside the roots.
    pub(super) fn confined(&self, name: &str) -> (PathBuf, bool) {
        let resolved = self.base_dir.join(name);
        // Checked by text first, so that a path outside answers the same
        // whether or not something is there (no oracle for which files
        // exist), then with symlinks resolved.
        let inside = |p: &Path| self.roots.iter().any(|root| p.starts_with(root));
        let outside = !inside(&lexically_absolute(&resolved))
            || std::fs::canonicalize(&resolved).is_ok_and(|real| !inside(&real));
        (resolved, !outside)
    }

    /// File `name`'s contents when `read_file` would read it, without a
    /// diagnostic or a record when it would not.
    pub(super) fn probe_file(&self, name: &str) -> Option<Vec<u8>> {
        match self.confined(name) {
            (resolved, true) => {
                crate::files::read_regular(&resolved, crate::files::MAX_REFERENCED_FILE).ok()
            }
            (_, false) => None,
        }
    }

    /// A file that holds a secret: read as `read_file` does, and refused
    /// when its group or others may read or write it (as ssh refuses a
    /// key anyone else can read).
    pub(super) fn secret(&mut self, path: String, name: &str) -> Option<Vec<u8>> {
        use std::os::unix::fs::PermissionsExt;
        let (resolved, _) = self.confined(name);
        if let Ok(meta) = std::fs::metadata(&resolved) {
            let mode = meta.permissions().mode() & 0o777;
            if mode & 0o077 != 0 {
                self.error(
                    Code::ExposedSecret,
                    path,
                    format!(
                        "'{name}' holds a secret but its mode is {mode:04o}: others may read it; `chmod 600` it"
                    ),
                );
                return None;
            }
        }
        self.read_file(path, name)
    }

    pub(super) fn read_file(&mut self, path: String, name: &str) -> Option<Vec<u8>> {
        let (resolved, inside) = self.confined(name);
        if !inside {
            self.error(
                Code::FileOutsideRoots,
                path,
                format!(
                    "'{name}' is outside the configuration's folder and runtime.file_roots; referenced files must be inside them"
                ),
            );
            return None;
        }
        match crate::files::read_regular(&resolved, crate::files::MAX_REFERENCED_FILE) {
            Ok(contents) => {
                self.referenced.push((name.to_owned(), contents.clone()));
                Some(contents)
            }
            Err(e) => {
                self.error(
                    Code::UnreadableFile,
                    path,
                    format!("cannot read '{}': {e}", resolved.display()),
                );
                None
            }
        }
    }
}

/// The folders referenced files may be in, symlinks resolved: the
/// configuration's own and the absolute `roots` that exist.
pub(super) fn confinement(base_dir: &Path, roots: &[PathBuf]) -> Vec<PathBuf> {
    std::iter::once(base_dir)
        .chain(
            roots
                .iter()
                .map(PathBuf::as_path)
                .filter(|r| r.is_absolute()),
        )
        .filter_map(|root| std::fs::canonicalize(root).ok())
        .collect()
}

/// `path` made absolute and its `.` and `..` resolved by text alone.
pub(super) fn lexically_absolute(path: &Path) -> PathBuf {
    let absolute = std::path::absolute(path).unwrap_or_else(|_| path.to_path_buf());
    let mut out = PathBuf::new();
    for part in absolute.components() {
        match part {
            std::path::Component::ParentDir => {
                out.pop();
            }
            std::path::Component::CurDir => {}
            other => out.push(other),
        }
    }
    out
}
