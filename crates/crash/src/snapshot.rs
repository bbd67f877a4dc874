//! What a path holds, read through the file system: the one function used both for the
//! expected states (read from the live file system after each operation) and for the
//! recovered state, so the two are always compared field by field in the same terms.

use jext_fs::{FileKind, Fs, FsError, FsResult, Ino, Timestamp};
use std::sync::Arc;

/// Attributes an fsync makes durable, beyond the data.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Meta {
    pub perm: u16,
    pub uid: u32,
    pub gid: u32,
    /// Links of a file; 0 for a directory (whose count follows its subdirectories).
    pub nlink: u32,
    /// Of a file; zero for a directory (whose times follow its entries).
    pub mtime: Timestamp,
    pub xattrs: Vec<(Vec<u8>, Vec<u8>)>,
}

/// What one path names.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Node {
    Absent,
    File {
        ino: Ino,
        data: Arc<[u8]>,
        meta: Meta,
    },
    Dir {
        ino: Ino,
        meta: Meta,
    },
    Symlink {
        ino: Ino,
        target: Vec<u8>,
        meta: Meta,
    },
}

/// A node's identity: which inode, of which kind, or nothing.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Identity {
    Absent,
    File(Ino),
    Dir(Ino),
    Symlink(Ino),
}

impl Node {
    pub fn identity(&self) -> Identity {
        match self {
            Node::Absent => Identity::Absent,
            Node::File { ino, .. } => Identity::File(*ino),
            Node::Dir { ino, .. } => Identity::Dir(*ino),
            Node::Symlink { ino, .. } => Identity::Symlink(*ino),
        }
    }

    pub fn ino(&self) -> Option<Ino> {
        match self {
            Node::Absent => None,
            Node::File { ino, .. } | Node::Dir { ino, .. } | Node::Symlink { ino, .. } => {
                Some(*ino)
            }
        }
    }

    pub fn meta(&self) -> Option<&Meta> {
        match self {
            Node::Absent => None,
            Node::File { meta, .. } | Node::Dir { meta, .. } | Node::Symlink { meta, .. } => {
                Some(meta)
            }
        }
    }

    /// A short description for failure reports.
    pub fn describe(&self) -> String {
        match self {
            Node::Absent => "absent".into(),
            Node::File { ino, data, .. } => format!("file #{ino} of {} bytes", data.len()),
            Node::Dir { ino, .. } => format!("directory #{ino}"),
            Node::Symlink { ino, target, .. } => {
                format!("symlink #{ino} -> {}", String::from_utf8_lossy(target))
            }
        }
    }
}

/// Reads what `path` names. A missing component (or one that is not a directory) reads
/// as absent; any other error is the file system's and is returned.
pub fn read_node(fs: &Fs, path: &str) -> FsResult<Node> {
    let ino = match fs.resolve(path) {
        Ok(ino) => ino,
        Err(FsError::NotFound(_)) | Err(FsError::NotDir(_)) => return Ok(Node::Absent),
        Err(e) => return Err(e),
    };
    let stat = fs.stat(ino)?;
    let mut xattrs = Vec::new();
    for name in fs.listxattr(ino)? {
        let value = fs.getxattr(ino, &name)?;
        xattrs.push((name, value));
    }
    xattrs.sort();
    let is_dir = stat.kind == FileKind::Directory;
    let meta = Meta {
        perm: stat.perm,
        uid: stat.uid,
        gid: stat.gid,
        nlink: if is_dir { 0 } else { stat.nlink },
        mtime: if is_dir {
            Timestamp::default()
        } else {
            stat.mtime
        },
        xattrs,
    };
    Ok(match stat.kind {
        FileKind::Directory => Node::Dir { ino, meta },
        FileKind::Symlink => Node::Symlink {
            ino,
            target: fs.readlink(ino)?,
            meta,
        },
        _ => {
            let data = fs.read(ino, 0, stat.size as usize)?;
            if data.len() as u64 != stat.size {
                return Err(FsError::Inconsistent(format!(
                    "{path}: read {} bytes of a {}-byte file",
                    data.len(),
                    stat.size
                )));
            }
            Node::File {
                ino,
                data: data.into(),
                meta,
            }
        }
    })
}
