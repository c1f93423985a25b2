//! The admin API's audit log (`admin.audit_log`, DESIGN §23): one JSON
//! line per admin call that changes something or is refused by
//! authentication or scope: when, who (the authenticated caller, or the
//! refusal), from where, what (method and path, never the query or the
//! body), how it ended (status) and the operation it started. Lines are
//! written by a thread of their own, off the serving threads; SIGUSR1
//! reopens the file (after logrotate moved it), with the other logs.

use std::fs::File;
use std::io::{self, Write};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::mpsc::{self, Receiver, SyncSender, TrySendError};
use std::sync::OnceLock;

use serde::Serialize;

/// One audited call.
#[derive(Debug, Clone, Serialize, PartialEq, Eq)]
pub struct Entry {
    /// RFC 3339, UTC.
    pub time: String,
    /// The authenticated caller; none when refused by authentication, or
    /// when the admin API has no callers.
    pub caller: Option<String>,
    /// `unauthorized` (no known token) or `forbidden` (a scope missing).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub refused: Option<&'static str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub missing_scope: Option<&'static str>,
    /// The peer's address (the admin socket's client).
    pub peer: Option<SocketAddr>,
    pub method: String,
    /// Without the query (which may carry what the caller wrote).
    pub path: String,
    pub status: u16,
    /// The operation the call started or settled, when it names one.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub operation_id: Option<String>,
}

enum Message {
    Entry(Box<Entry>),
    Reopen,
    Flush(mpsc::Sender<()>),
}

static SINK: OnceLock<SyncSender<Message>> = OnceLock::new();

/// Entries waiting for the writer at most; past it an entry is refused
/// (and said so in the log: an audit line is never dropped silently).
const QUEUE: usize = 4096;

/// Starts the writer for `path`, created if missing, readable by its
/// owner only. A second call does nothing (one log per process).
pub fn init(path: &Path) -> io::Result<()> {
    if SINK.get().is_some() {
        return Ok(());
    }
    let file = open(path)?;
    let (queue, entries) = mpsc::sync_channel(QUEUE);
    let path = path.to_path_buf();
    std::thread::Builder::new()
        .name("cutover-audit".into())
        .spawn(move || write_entries(entries, path, file))?;
    let _ = SINK.set(queue);
    Ok(())
}

/// Whether an audit log is written.
pub fn enabled() -> bool {
    SINK.get().is_some()
}

/// Queues `entry`.
pub fn record(entry: Entry) {
    let Some(sink) = SINK.get() else { return };
    if let Err(TrySendError::Full(Message::Entry(entry))) =
        sink.try_send(Message::Entry(Box::new(entry)))
    {
        tracing::error!(method = %entry.method, path = %entry.path, caller = ?entry.caller, status = entry.status, "the audit log is behind: this admin call is not in it");
    }
}

/// Reopens the file (SIGUSR1).
pub fn reopen() {
    if let Some(sink) = SINK.get() {
        let _ = sink.send(Message::Reopen);
    }
}

/// Waits until every entry queued so far is written, at most `timeout`.
pub fn flush(timeout: std::time::Duration) {
    let Some(sink) = SINK.get() else { return };
    let (done, wait) = mpsc::channel();
    if sink.send(Message::Flush(done)).is_ok() {
        let _ = wait.recv_timeout(timeout);
    }
}

fn open(path: &Path) -> io::Result<File> {
    use std::os::unix::fs::OpenOptionsExt;
    std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .mode(0o600)
        .open(path)
}

fn write_entries(entries: Receiver<Message>, path: PathBuf, mut file: File) {
    let mut line = Vec::with_capacity(512);
    while let Ok(message) = entries.recv() {
        match message {
            Message::Entry(entry) => {
                line.clear();
                if serde_json::to_writer(&mut line, &entry).is_err() {
                    continue;
                }
                line.push(b'\n');
                if let Err(error) = file.write_all(&line) {
                    tracing::error!(path = %path.display(), %error, "cannot write the audit log");
                }
            }
            Message::Reopen => match open(&path) {
                Ok(fresh) => file = fresh,
                Err(error) => {
                    tracing::error!(path = %path.display(), %error, "cannot reopen the audit log; still writing to the old file")
                }
            },
            Message::Flush(done) => {
                let _ = file.flush();
                let _ = done.send(());
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_entry_is_one_json_line_without_empty_fields() {
        let entry = Entry {
            time: "2026-12-06T05:00:00Z".into(),
            caller: Some("ci".into()),
            refused: None,
            missing_scope: None,
            peer: Some("127.0.0.1:5000".parse().unwrap()),
            method: "POST".into(),
            path: "/admin/runtime/activate".into(),
            status: 200,
            operation_id: Some("op-1".into()),
        };
        let text = serde_json::to_string(&entry).unwrap();
        assert_eq!(
            text,
            r#"{"time":"2026-12-06T05:00:00Z","caller":"ci","peer":"127.0.0.1:5000","method":"POST","path":"/admin/runtime/activate","status":200,"operation_id":"op-1"}"#
        );
    }
}
