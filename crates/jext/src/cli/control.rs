//! The mount daemon's control socket, and its clients `jext sync DIR` and
//! `jext mount -o remount,...`.
//!
//! A `fuseblk` jext mount gets `sync`/`syncfs` from the kernel itself (Linux 6.18+); a mount
//! made without a loop device (plain `fuse`) does not, and there `jext sync DIR` closes the
//! gap: it syncs DIR's file system in the kernel (so pages held by the kernel's writeback
//! cache reach the daemon), then asks the daemon over a Unix socket under `/run/jext` to run
//! `Fs::sync` (commit the running transaction, write back ordered data, flush the device),
//! and returns only when the daemon answers that it is done. A remount asks the daemon to go
//! read-only (`Fs::remount`: commit, checkpoint, clean image) or back to read-write, since
//! the kernel tells a FUSE daemon nothing of a remount.
//!
//! Promises: "ok" is answered only after the request returned success; any error is passed
//! on word for word and makes the client fail. Must never answer before the work has
//! finished, nor leave its socket file behind after a clean unmount.

use jext::Fs;
use jext_fuse::requests::{DaemonStats, RequestCounts};
use std::collections::BTreeMap;
use std::io::{BufRead, BufReader, Write};
use std::os::fd::AsRawFd;
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// The requests the socket understands, and the answer to one that succeeded.
const SYNC_REQUEST: &str = "sync";
const REMOUNT_RO: &str = "remount ro";
const REMOUNT_RW: &str = "remount rw";
/// Asks for the daemon's [`DaemonStats`]; answered with `stats ` and their text form.
const STATS_REQUEST: &str = "stats";
const STATS_REPLY: &str = "stats ";
const DONE: &str = "ok";

/// The listening socket of a daemon; its file is removed when this is dropped.
pub struct ControlSocket {
    path: PathBuf,
}

impl Drop for ControlSocket {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.path);
    }
}

/// Starts answering requests for `fs` (and its mount's `requests`) on the socket at `path`
/// (a thread per daemon; requests are served one at a time, a sync by a full `Fs::sync`).
pub fn listen(
    path: PathBuf,
    fs: Fs,
    requests: Arc<RequestCounts>,
) -> std::io::Result<ControlSocket> {
    // A daemon killed with SIGKILL leaves its socket file; nothing listens on it any more.
    let _ = std::fs::remove_file(&path);
    let listener = UnixListener::bind(&path)?;
    std::thread::spawn(move || {
        for stream in listener.incoming().flatten() {
            if let Err(e) = answer(stream, &fs, &requests) {
                eprintln!("jext mount: control request failed: {e}");
            }
        }
    });
    Ok(ControlSocket { path })
}

fn answer(stream: UnixStream, fs: &Fs, requests: &RequestCounts) -> std::io::Result<()> {
    let mut request = String::new();
    BufReader::new(&stream).read_line(&mut request)?;
    let done = |result: jext::FsResult<()>, what: &str| match result {
        Ok(()) => DONE.to_string(),
        Err(e) => format!("{what} failed: {e}"),
    };
    let reply = match request.trim_end() {
        SYNC_REQUEST => done(fs.sync(), "sync"),
        REMOUNT_RO => done(fs.remount(true), "remount,ro"),
        REMOUNT_RW => done(fs.remount(false), "remount,rw"),
        STATS_REQUEST => {
            let mut stats = DaemonStats::of_this_process(requests);
            stats.fsyncs = fsync_counts(&fs.fast_commit_stats());
            format!("{STATS_REPLY}{}", stats.encode())
        }
        other => format!(
            "unknown request {other:?} (this daemon understands {SYNC_REQUEST:?}, \
             {REMOUNT_RO:?}, {REMOUNT_RW:?} and {STATS_REQUEST:?})"
        ),
    };
    (&stream).write_all(format!("{reply}\n").as_bytes())
}

/// How the daemon's fsyncs were made durable, by the names [`DaemonStats::fsyncs`] uses.
fn fsync_counts(fc: &jext::FastCommitStats) -> BTreeMap<String, u64> {
    let mut counts: BTreeMap<String, u64> = fc
        .fallbacks
        .iter()
        .map(|(reason, n)| (format!("full_{reason}"), *n))
        .collect();
    counts.insert("fast_commit".into(), fc.fast_commits);
    counts.insert("obsolete".into(), fc.obsolete);
    counts.retain(|_, n| *n > 0);
    counts
}

/// `jext sync DIR`: makes everything written under the jext mount at DIR durable.
pub fn sync(mountpoint: &Path, socket: &Path) -> Result<(), String> {
    let dir = std::fs::File::open(mountpoint)
        .map_err(|e| format!("cannot open {}: {e}", mountpoint.display()))?;
    // SAFETY: syncfs(2) on a descriptor this function owns and keeps open for the call.
    if unsafe { libc::syncfs(dir.as_raw_fd()) } != 0 {
        let e = std::io::Error::last_os_error();
        return Err(format!("syncfs {}: {e}", mountpoint.display()));
    }
    ask(mountpoint, socket, SYNC_REQUEST, "sync")
}

/// Asks the daemon of the mount at `mountpoint` to go read-only (commit, checkpoint,
/// clean image) or back to read-write.
pub fn remount(mountpoint: &Path, socket: &Path, read_only: bool) -> Result<(), String> {
    let request = if read_only { REMOUNT_RO } else { REMOUNT_RW };
    ask(mountpoint, socket, request, "remount")
}

/// The FUSE requests the daemon of the mount at `mountpoint` has served so far, and its
/// context switches.
pub fn stats(mountpoint: &Path, socket: &Path) -> Result<DaemonStats, String> {
    let reply = ask_for(mountpoint, socket, STATS_REQUEST, "stats")?;
    match reply.strip_prefix(STATS_REPLY) {
        Some(text) => DaemonStats::decode(text),
        None => Err(reply),
    }
}

/// Sends one request and waits for "ok".
fn ask(mountpoint: &Path, socket: &Path, request: &str, what: &str) -> Result<(), String> {
    match ask_for(mountpoint, socket, request, what)?.as_str() {
        DONE => Ok(()),
        error => Err(error.to_string()),
    }
}

/// Sends one request and returns the daemon's answer line.
fn ask_for(mountpoint: &Path, socket: &Path, request: &str, what: &str) -> Result<String, String> {
    let mut stream = UnixStream::connect(socket).map_err(|e| {
        format!(
            "no jext daemon answers for {} ({}: {e}); is it a jext mount?",
            mountpoint.display(),
            socket.display()
        )
    })?;
    stream
        .write_all(format!("{request}\n").as_bytes())
        .map_err(|e| format!("asking the daemon to {what}: {e}"))?;
    let mut reply = String::new();
    BufReader::new(&stream)
        .read_line(&mut reply)
        .map_err(|e| format!("waiting for the daemon's {what}: {e}"))?;
    match reply.trim_end() {
        "" => Err(format!(
            "the daemon closed the connection before its {what} finished"
        )),
        answer => Ok(answer.to_string()),
    }
}
