//! Files as the control plane reads and writes them: reading the files a
//! configuration names, and the configuration itself, so that no path can
//! stall or exhaust the control plane; writing state whole or not at all.
//! The ground floor: it imports nothing of the crate.
//!
//! Only regular files are read: a FIFO would block the read (and the
//! operation lock with it) until someone writes to it, and a device such
//! as `/dev/zero` never ends. The file is opened without blocking and
//! checked on the open descriptor, so it cannot be swapped for a FIFO
//! between the check and the read, and it is read up to a size cap.

use std::io::{self, Read, Write};
use std::path::Path;

use rustix::fs::{Mode, OFlags};

/// Largest certificate, key, CA bundle or token file read.
pub const MAX_REFERENCED_FILE: u64 = 4 * 1024 * 1024;

/// Largest configuration file read (10 000 routes are about 1.2 MB).
pub const MAX_CONFIG_FILE: u64 = 32 * 1024 * 1024;

/// Reads the regular file at `path`, at most `limit` bytes.
pub fn read_regular(path: &Path, limit: u64) -> io::Result<Vec<u8>> {
    // O_NONBLOCK: opening a FIFO for reading would otherwise wait for a
    // writer. It does not change how a regular file reads.
    let fd = rustix::fs::open(
        path,
        OFlags::RDONLY | OFlags::NONBLOCK | OFlags::CLOEXEC,
        Mode::empty(),
    )?;
    let file = std::fs::File::from(fd);
    let metadata = file.metadata()?;
    if !metadata.is_file() {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            "not a regular file",
        ));
    }
    if metadata.len() > limit {
        return Err(too_large(limit));
    }
    let mut contents = Vec::with_capacity(usize::try_from(metadata.len()).unwrap_or(0));
    // The file may grow while it is read: the cap holds regardless.
    file.take(limit + 1).read_to_end(&mut contents)?;
    if contents.len() as u64 > limit {
        return Err(too_large(limit));
    }
    Ok(contents)
}

fn too_large(limit: u64) -> io::Error {
    io::Error::new(
        io::ErrorKind::InvalidData,
        format!("larger than {limit} bytes"),
    )
}

/// As `read_regular`, as UTF-8 text.
pub fn read_regular_text(path: &Path, limit: u64) -> io::Result<String> {
    String::from_utf8(read_regular(path, limit)?)
        .map_err(|_| io::Error::new(io::ErrorKind::InvalidData, "not UTF-8 text"))
}

/// Temporary file, fsync, rename over the target, fsync of the folder: a
/// crash leaves either the old or the new file, never a torn one.
/// Writes `dir/name` as a whole or not at all: a temporary file, synced,
/// renamed over it, the folder synced.
pub fn write_atomically(
    dir: &Path,
    name: &str,
    write: impl FnOnce(&mut std::io::BufWriter<&std::fs::File>) -> std::io::Result<()>,
) -> std::io::Result<()> {
    std::fs::create_dir_all(dir)?;
    let tmp = dir.join(format!(".{name}.tmp-{}", std::process::id()));
    {
        let file = std::fs::File::create(&tmp)?;
        let mut out = std::io::BufWriter::with_capacity(64 * 1024, &file);
        write(&mut out)?;
        out.flush()?;
        drop(out);
        file.sync_all()?;
    }
    std::fs::rename(&tmp, dir.join(name))?;
    std::fs::File::open(dir)?.sync_all()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_regular_files_are_read_and_only_up_to_the_cap() {
        let dir = tempfile::tempdir().expect("dir");
        let file = dir.path().join("a.pem");
        std::fs::write(&file, b"0123456789").expect("write");
        assert_eq!(read_regular(&file, 10).expect("read"), b"0123456789");
        assert!(read_regular(&file, 9).is_err());
        // Devices and folders are refused before any read.
        for path in ["/dev/zero", "/dev/null"] {
            let error = read_regular(Path::new(path), 1024).expect_err(path);
            assert!(error.to_string().contains("not a regular file"), "{error}");
        }
        assert!(read_regular(dir.path(), 1024).is_err());
    }

    #[test]
    fn a_fifo_is_refused_at_once() {
        let dir = tempfile::tempdir().expect("dir");
        let fifo = dir.path().join("fifo.pem");
        rustix::fs::mknodat(
            rustix::fs::CWD,
            &fifo,
            rustix::fs::FileType::Fifo,
            Mode::from_raw_mode(0o600),
            0,
        )
        .expect("mkfifo");
        let started = std::time::Instant::now();
        let error = read_regular(&fifo, 1024).expect_err("a FIFO");
        assert!(error.to_string().contains("not a regular file"), "{error}");
        assert!(started.elapsed() < std::time::Duration::from_secs(1));
    }
}
