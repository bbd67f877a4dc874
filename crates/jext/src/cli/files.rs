//! The offline file tools, for use without root or FUSE: `jext ls`, `jext cat`, `jext get`
//! (copy a tree out of an image, keeping modes, owners, times, symlinks and xattrs) and
//! `jext put` (copy a tree into an image). They open the image through the library, so a
//! dirty journal is recovered first, and `put` ends with a clean unmount.
//!
//! Must never write to an image for `ls`, `cat` or `get`: those open it read-only, and
//! a journal that needs recovery is replayed in memory only.

use super::progress::Progress;
use jext::{FileKind, Fs, Ino, MountOptions, SetAttr, Stat, Timestamp, XattrSetMode};
use std::fs;
use std::io::Write;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::Path;
use std::sync::Arc;

type Result<T> = std::result::Result<T, Box<dyn std::error::Error>>;

fn report(command: &str, result: Result<()>) -> i32 {
    match result {
        Ok(()) => 0,
        Err(e) => {
            eprintln!("jext {command}: {e}");
            1
        }
    }
}

/// Opens an image; read-only opens go through a copy-on-write overlay, so that replaying
/// a dirty journal happens in memory and the image is never written.
fn open(image: &Path, read_only: bool) -> Result<Fs> {
    let failed = |e: &dyn std::fmt::Display| format!("cannot open {}: {e}", image.display());
    let options = MountOptions {
        read_only,
        ..MountOptions::default()
    };
    // Opening replays a dirty journal, which for a long one takes a while.
    let progress = Progress::spinner(&format!("opening {}", image.display()));
    let opened = if read_only {
        super::note_live_owner(image);
        jext::open_device(image, true)
            .map_err(|e| failed(&e))
            .and_then(|device| {
                let overlay: Arc<dyn jext::BlockDevice> =
                    Arc::new(jext::OverlayDevice::new(device));
                Fs::open(overlay, options).map_err(|e| failed(&e))
            })
    } else {
        Fs::open_path(image, options).map_err(|e| failed(&e))
    };
    progress.finish();
    Ok(opened?)
}

fn resolve(fs: &Fs, path: &str) -> Result<Ino> {
    fs.resolve(path).map_err(|e| format!("{path}: {e}").into())
}

pub fn ls(image: &Path, path: &str) -> i32 {
    report(
        "ls",
        (|| {
            let fs = open(image, true)?;
            let ino = resolve(&fs, path)?;
            let st = fs.stat(ino)?;
            let mut out = std::io::stdout().lock();
            if st.kind != FileKind::Directory {
                return Ok(writeln!(out, "{}", line(&st, path.as_bytes()))?);
            }
            let mut cookie = 0;
            loop {
                let entries = fs.readdir(ino, cookie)?;
                let Some(last) = entries.last() else { break };
                cookie = last.next_cookie;
                for e in &entries {
                    writeln!(out, "{}", line(&fs.stat(e.ino)?, &e.name))?;
                }
            }
            Ok(())
        })(),
    )
}

fn line(st: &Stat, name: &[u8]) -> String {
    let kind = match st.kind {
        FileKind::Directory => 'd',
        FileKind::Symlink => 'l',
        FileKind::CharDevice => 'c',
        FileKind::BlockDevice => 'b',
        FileKind::Fifo => 'p',
        FileKind::Socket => 's',
        FileKind::Regular => '-',
    };
    format!(
        "{kind}{:04o} {:>3} {:>5} {:>5} {:>12} {:>8} {}",
        st.perm,
        st.nlink,
        st.uid,
        st.gid,
        st.size,
        st.ino,
        String::from_utf8_lossy(name)
    )
}

pub fn cat(image: &Path, path: &str) -> i32 {
    report(
        "cat",
        (|| {
            let fs = open(image, true)?;
            let ino = resolve(&fs, path)?;
            let size = fs.stat(ino)?.size;
            let mut out = std::io::stdout().lock();
            let mut offset = 0;
            while offset < size {
                let chunk = fs.read(ino, offset, 1 << 20)?;
                if chunk.is_empty() {
                    break;
                }
                offset += chunk.len() as u64;
                out.write_all(&chunk)?;
            }
            Ok(())
        })(),
    )
}

pub fn get(image: &Path, path: &str, dest: &Path) -> i32 {
    report(
        "get",
        (|| {
            let fs = open(image, true)?;
            let ino = resolve(&fs, path)?;
            let progress = Progress::copy("copying out");
            let copied = copy_out(&fs, ino, dest, &progress);
            progress.finish();
            copied
        })(),
    )
}

/// Copies inode `ino` (recursively for a directory) to `dest` on the host.
fn copy_out(fs: &Fs, ino: Ino, dest: &Path, progress: &Progress) -> Result<()> {
    let st = fs.stat(ino)?;
    match st.kind {
        FileKind::Directory => {
            fs::create_dir_all(dest)?;
            let mut cookie = 0;
            loop {
                let entries = fs.readdir(ino, cookie)?;
                let Some(last) = entries.last() else { break };
                cookie = last.next_cookie;
                for e in entries.iter().filter(|e| e.name != b"." && e.name != b"..") {
                    let to = dest.join(std::ffi::OsStr::from_bytes(&e.name));
                    copy_out(fs, e.ino, &to, progress)?;
                }
            }
        }
        FileKind::Symlink => {
            let target = fs.readlink(ino)?;
            std::os::unix::fs::symlink(std::ffi::OsStr::from_bytes(&target), dest)?;
            progress.file_done("copied out");
            return Ok(()); // a symlink's own mode and times are not settable portably
        }
        FileKind::Regular => {
            let mut out = fs::File::create(dest)?;
            let mut offset = 0;
            while offset < st.size {
                let chunk = fs.read(ino, offset, 1 << 20)?;
                if chunk.is_empty() {
                    break;
                }
                offset += chunk.len() as u64;
                out.write_all(&chunk)?;
                progress.bytes(chunk.len() as u64);
            }
        }
        other => {
            return Err(format!(
                "{}: cannot copy a {other:?} out of an image",
                dest.display()
            )
            .into())
        }
    }
    for name in fs.listxattr(ino)? {
        let value = fs.getxattr(ino, &name)?;
        set_host_xattr(dest, &name, &value)?;
    }
    fs::set_permissions(dest, fs::Permissions::from_mode(u32::from(st.perm)))?;
    std::os::unix::fs::chown(dest, Some(st.uid), Some(st.gid))?;
    let times = fs::FileTimes::new()
        .set_accessed(st.atime.into())
        .set_modified(st.mtime.into());
    fs::File::options()
        .read(true)
        .open(dest)?
        .set_times(times)?;
    progress.file_done("copied out");
    Ok(())
}

/// Host xattrs through `setfattr` (attr package): std has no xattr calls, and this keeps
/// the tool free of unsafe code.
fn set_host_xattr(path: &Path, name: &[u8], value: &[u8]) -> Result<()> {
    let hex: String = value.iter().map(|b| format!("{b:02x}")).collect();
    let status = std::process::Command::new("setfattr")
        .arg("-n")
        .arg(std::ffi::OsStr::from_bytes(name))
        .arg("-v")
        .arg(format!("0x{hex}"))
        .arg(path)
        .status()
        .map_err(|e| format!("cannot run setfattr (install the attr package): {e}"))?;
    if !status.success() {
        return Err(format!(
            "setfattr {} on {} failed",
            String::from_utf8_lossy(name),
            path.display()
        )
        .into());
    }
    Ok(())
}

pub fn put(src: &Path, image: &Path, path: &str) -> i32 {
    report(
        "put",
        (|| {
            let fs = open(image, false)?;
            let (parent, name) = split(path)?;
            let parent = resolve(&fs, parent)?;
            let progress = Progress::copy("copying in");
            let copied = copy_in(&fs, src, parent, name.as_bytes(), &progress);
            progress.say("writing back and checkpointing".into());
            let unmounted = fs.unmount();
            progress.finish();
            copied?;
            Ok(unmounted?)
        })(),
    )
}

fn split(path: &str) -> Result<(&str, &str)> {
    let trimmed = path.trim_end_matches('/');
    match trimmed.rsplit_once('/') {
        Some((parent, name)) if !name.is_empty() => {
            Ok((if parent.is_empty() { "/" } else { parent }, name))
        }
        _ => Err(format!("{path}: give the path inside the image, like /dir/name").into()),
    }
}

/// Copies the host path `src` into directory `parent` as `name`.
fn copy_in(fs: &Fs, src: &Path, parent: Ino, name: &[u8], progress: &Progress) -> Result<()> {
    let meta = fs::symlink_metadata(src)?;
    let (uid, gid) = (meta.uid(), meta.gid());
    let perm = meta.mode() & 0o7777;
    let st = if meta.is_dir() {
        let st = fs.mkdir(parent, name, perm, uid, gid)?;
        for entry in fs::read_dir(src)? {
            let entry = entry?;
            copy_in(
                fs,
                &entry.path(),
                st.ino,
                entry.file_name().as_bytes(),
                progress,
            )?;
        }
        st
    } else if meta.file_type().is_symlink() {
        let target = fs::read_link(src)?;
        fs.symlink(parent, name, target.as_os_str().as_bytes(), uid, gid)?;
        progress.file_done("copied in");
        return Ok(());
    } else if meta.is_file() {
        let st = fs.create(parent, name, perm, uid, gid)?;
        let data = fs::read(src)?;
        let mut offset = 0;
        while offset < data.len() {
            let n = fs.write(st.ino, offset as u64, &data[offset..])?;
            offset += n;
            progress.bytes(n as u64);
        }
        st
    } else {
        return Err(format!(
            "{}: only files, directories and symlinks can be put",
            src.display()
        )
        .into());
    };
    let times = SetAttr {
        atime: Some(Timestamp {
            seconds: meta.atime(),
            nanoseconds: meta.atime_nsec() as u32,
        }),
        mtime: Some(Timestamp {
            seconds: meta.mtime(),
            nanoseconds: meta.mtime_nsec() as u32,
        }),
        ..SetAttr::default()
    };
    fs.setattr(st.ino, &times)?;
    for (name, value) in host_xattrs(src)? {
        fs.setxattr(st.ino, &name, &value, XattrSetMode::Either)?;
    }
    progress.file_done("copied in");
    Ok(())
}

/// The user and trusted xattrs of a host file, through `getfattr` (see `set_host_xattr`).
fn host_xattrs(path: &Path) -> Result<Vec<(Vec<u8>, Vec<u8>)>> {
    let out = std::process::Command::new("getfattr")
        .args([
            "--absolute-names",
            "-d",
            "-m",
            "^(user|trusted)\\.",
            "-e",
            "hex",
        ])
        .arg(path)
        .output()
        .map_err(|e| format!("cannot run getfattr (install the attr package): {e}"))?;
    let text = String::from_utf8_lossy(&out.stdout);
    let mut attrs = Vec::new();
    for line in text
        .lines()
        .filter(|l| !l.starts_with('#') && l.contains('='))
    {
        let (name, value) = line.split_once('=').expect("checked above");
        let hex = value.trim_start_matches("0x");
        let bytes: Option<Vec<u8>> = (0..hex.len())
            .step_by(2)
            .map(|i| u8::from_str_radix(hex.get(i..i + 2)?, 16).ok())
            .collect();
        let bytes = bytes.ok_or_else(|| format!("getfattr printed {line:?}"))?;
        attrs.push((name.as_bytes().to_vec(), bytes));
    }
    Ok(attrs)
}
