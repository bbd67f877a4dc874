//! The mount daemon's control socket and `jext sync DIR`, its one client.
//!
//! The kernel forwards `sync(2)`/`syncfs(2)` to a FUSE server only on `fuseblk` and
//! virtiofs connections, so on a jext mount `sync` returns before anything is durable.
//! `jext sync DIR` closes that gap: it syncs DIR's file system in the kernel (so pages held
//! by the kernel's writeback cache reach the daemon), then asks the daemon over a Unix
//! socket under `/run/jext` to run `Fs::sync` (commit the running transaction, write back
//! ordered data, flush the device), and returns only when the daemon answers that it is done.
//!
//! Promises: "ok" is answered only after `Fs::sync` returned success; any error is passed on
//! word for word and makes `jext sync` fail. Must never answer before the sync has finished,
//! nor leave its socket file behind after a clean unmount.

use jext::Fs;
use std::io::{BufRead, BufReader, Write};
use std::os::fd::AsRawFd;
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};

/// The one request the socket understands, and the answer to a sync that succeeded.
const SYNC_REQUEST: &str = "sync";
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

/// Starts answering sync requests for `fs` on the socket at `path` (a thread per daemon;
/// requests are served one at a time, each by a full `Fs::sync`).
pub fn listen(path: PathBuf, fs: Fs) -> std::io::Result<ControlSocket> {
    // A daemon killed with SIGKILL leaves its socket file; nothing listens on it any more.
    let _ = std::fs::remove_file(&path);
    let listener = UnixListener::bind(&path)?;
    std::thread::spawn(move || {
        for stream in listener.incoming().flatten() {
            if let Err(e) = answer(stream, &fs) {
                eprintln!("jext mount: control request failed: {e}");
            }
        }
    });
    Ok(ControlSocket { path })
}

fn answer(stream: UnixStream, fs: &Fs) -> std::io::Result<()> {
    let mut request = String::new();
    BufReader::new(&stream).read_line(&mut request)?;
    let reply = match request.trim_end() {
        SYNC_REQUEST => match fs.sync() {
            Ok(()) => DONE.to_string(),
            Err(e) => format!("sync failed: {e}"),
        },
        other => format!("unknown request {other:?} (this daemon understands {SYNC_REQUEST:?})"),
    };
    (&stream).write_all(format!("{reply}\n").as_bytes())
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
    let mut stream = UnixStream::connect(socket).map_err(|e| {
        format!(
            "no jext daemon answers for {} ({}: {e}); is it a jext mount?",
            mountpoint.display(),
            socket.display()
        )
    })?;
    stream
        .write_all(format!("{SYNC_REQUEST}\n").as_bytes())
        .map_err(|e| format!("asking the daemon to sync: {e}"))?;
    let mut reply = String::new();
    BufReader::new(&stream)
        .read_line(&mut reply)
        .map_err(|e| format!("waiting for the daemon's sync: {e}"))?;
    match reply.trim_end() {
        DONE => Ok(()),
        "" => Err("the daemon closed the connection before its sync finished".to_string()),
        error => Err(error.to_string()),
    }
}
