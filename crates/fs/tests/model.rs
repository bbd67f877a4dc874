//! Random operation sequences through the library, checked against an in-memory model;
//! then `e2fsck -fn` must be clean and Linux, loop-mounting the image, must show the same
//! tree, modes, sizes, bytes, links and xattrs. Every data mode, both block sizes.

mod common;

use common::{assert_e2fsck_clean, mkfs_ext4, run, LoopMount, Scratch};
use jext_fs::{
    DataMode, FallocateMode, FileKind, Fs, Ino, MountOptions, RenameFlags, SetAttr, XattrSetMode,
};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use std::collections::{BTreeMap, HashMap};
use std::os::unix::fs::{MetadataExt, PermissionsExt};

#[derive(Clone, Debug)]
enum Kind {
    File(Vec<u8>),
    Dir,
    Symlink(Vec<u8>),
}

#[derive(Clone, Debug)]
struct Node {
    kind: Kind,
    perm: u32,
    xattrs: BTreeMap<Vec<u8>, Vec<u8>>,
}

/// Paths ("/a/b") to node ids; nodes shared by hard links.
#[derive(Default)]
struct Model {
    paths: BTreeMap<String, usize>,
    nodes: HashMap<usize, Node>,
    next_id: usize,
}

impl Model {
    fn new() -> Model {
        let mut m = Model::default();
        m.paths.insert("/".into(), 0);
        m.nodes.insert(
            0,
            Node {
                kind: Kind::Dir,
                perm: 0o755,
                xattrs: BTreeMap::new(),
            },
        );
        m.next_id = 1;
        // mkfs made it; the random operations may use it like any directory.
        m.add(
            "/lost+found".into(),
            Node {
                kind: Kind::Dir,
                perm: 0o700,
                xattrs: BTreeMap::new(),
            },
        );
        m
    }

    fn add(&mut self, path: String, node: Node) {
        let id = self.next_id;
        self.next_id += 1;
        self.nodes.insert(id, node);
        self.paths.insert(path, id);
    }

    fn dirs(&self) -> Vec<String> {
        self.paths
            .iter()
            .filter(|(_, id)| matches!(self.nodes[id].kind, Kind::Dir))
            .map(|(p, _)| p.clone())
            .collect()
    }

    fn files(&self) -> Vec<String> {
        self.paths
            .iter()
            .filter(|(_, id)| matches!(self.nodes[id].kind, Kind::File(_)))
            .map(|(p, _)| p.clone())
            .collect()
    }

    fn children(&self, dir: &str) -> Vec<String> {
        let prefix = if dir == "/" {
            "/".to_string()
        } else {
            format!("{dir}/")
        };
        self.paths
            .keys()
            .filter(|p| {
                p.starts_with(&prefix) && p.len() > prefix.len() && !p[prefix.len()..].contains('/')
            })
            .cloned()
            .collect()
    }

    fn links(&self, id: usize) -> usize {
        self.paths.values().filter(|&&i| i == id).count()
    }
}

/// Prints an operation when JEXT_MODEL_CHECK_EACH is set.
fn trace(what: String) {
    if std::env::var("JEXT_MODEL_CHECK_EACH").is_ok() {
        eprintln!("{what}");
    }
}

fn join(dir: &str, name: &str) -> String {
    if dir == "/" {
        format!("/{name}")
    } else {
        format!("{dir}/{name}")
    }
}

fn split(path: &str) -> (&str, &str) {
    let (d, n) = path.rsplit_once('/').unwrap();
    (if d.is_empty() { "/" } else { d }, n)
}

struct Runner<'a> {
    fs: &'a Fs,
    model: Model,
    rng: StdRng,
    names: usize,
}

impl Runner<'_> {
    fn pick<T: Clone>(&mut self, v: &[T]) -> Option<T> {
        (!v.is_empty()).then(|| v[self.rng.gen_range(0..v.len())].clone())
    }

    fn fresh_name(&mut self) -> String {
        self.names += 1;
        let pad = "x".repeat(self.rng.gen_range(0..30));
        format!("n{}{}", self.names, pad)
    }

    fn ino(&self, path: &str) -> Ino {
        self.fs
            .resolve(path)
            .unwrap_or_else(|e| panic!("resolve {path}: {e}"))
    }

    fn random_bytes(&mut self, len: usize) -> Vec<u8> {
        let seed: u8 = self.rng.gen();
        (0..len)
            .map(|i| seed.wrapping_add((i * 31 % 251) as u8))
            .collect()
    }

    fn step(&mut self) {
        let choice = self.rng.gen_range(0..100);
        match choice {
            0..=14 => self.create(),
            15..=19 => self.mkdir(),
            20..=39 => self.write(),
            40..=45 => self.truncate(),
            46..=51 => self.unlink(),
            52..=54 => self.rmdir(),
            55..=62 => self.rename(),
            63..=66 => self.link(),
            67..=70 => self.symlink(),
            71..=76 => self.xattr(),
            77..=79 => self.chmod(),
            80..=86 => self.fallocate(),
            87..=89 => self.fsync(),
            90..=91 => self.read_back(),
            92..=94 => {
                trace("writeback_now".into());
                self.fs.writeback_now().unwrap()
            }
            // What the writeback and commit timers do, at a deterministic point.
            _ => {
                trace("sync".into());
                self.fs.sync().unwrap()
            }
        }
    }

    fn create(&mut self) {
        let dir = self.pick(&self.model.dirs()).unwrap();
        let name = self.fresh_name();
        let perm = [0o644, 0o600, 0o755][self.rng.gen_range(0..3)];
        let parent = self.ino(&dir);
        self.fs.create(parent, name.as_bytes(), perm, 0, 0).unwrap();
        self.model.add(
            join(&dir, &name),
            Node {
                kind: Kind::File(Vec::new()),
                perm,
                xattrs: BTreeMap::new(),
            },
        );
    }

    fn mkdir(&mut self) {
        let dir = self.pick(&self.model.dirs()).unwrap();
        let name = self.fresh_name();
        let parent = self.ino(&dir);
        self.fs.mkdir(parent, name.as_bytes(), 0o750, 0, 0).unwrap();
        // A directory made in a setgid directory inherits the setgid bit.
        let setgid = self.model.nodes[&self.model.paths[&dir]].perm & 0o2000;
        self.model.add(
            join(&dir, &name),
            Node {
                kind: Kind::Dir,
                perm: 0o750 | setgid,
                xattrs: BTreeMap::new(),
            },
        );
    }

    fn write(&mut self) {
        let Some(path) = self.pick(&self.model.files()) else {
            return;
        };
        let id = self.model.paths[&path];
        let Kind::File(data) = &self.model.nodes[&id].kind else {
            unreachable!()
        };
        let size = data.len();
        let offset = self.rng.gen_range(0..=size + 5000);
        let len = if self.rng.gen_bool(0.05) {
            self.rng.gen_range(50_000..300_000)
        } else {
            self.rng.gen_range(1..9000)
        };
        let bytes = self.random_bytes(len);
        let ino = self.ino(&path);
        trace(format!("write {path} at {offset} len {len} (size {size})"));
        assert_eq!(self.fs.write(ino, offset as u64, &bytes).unwrap(), len);
        let Kind::File(data) = &mut self.model.nodes.get_mut(&id).unwrap().kind else {
            unreachable!()
        };
        if data.len() < offset + len {
            data.resize(offset + len, 0);
        }
        data[offset..offset + len].copy_from_slice(&bytes);
    }

    fn truncate(&mut self) {
        let Some(path) = self.pick(&self.model.files()) else {
            return;
        };
        let id = self.model.paths[&path];
        let size = self.rng.gen_range(0..20_000);
        let ino = self.ino(&path);
        trace(format!("truncate {path} to {size}"));
        self.fs
            .setattr(
                ino,
                &SetAttr {
                    size: Some(size as u64),
                    ..SetAttr::default()
                },
            )
            .unwrap();
        let Kind::File(data) = &mut self.model.nodes.get_mut(&id).unwrap().kind else {
            unreachable!()
        };
        data.resize(size, 0);
    }

    fn unlink(&mut self) {
        let candidates: Vec<String> = self
            .model
            .paths
            .iter()
            .filter(|(_, id)| !matches!(self.model.nodes[id].kind, Kind::Dir))
            .map(|(p, _)| p.clone())
            .collect();
        let Some(path) = self.pick(&candidates) else {
            return;
        };
        let (dir, name) = split(&path);
        self.fs.unlink(self.ino(dir), name.as_bytes()).unwrap();
        self.model.paths.remove(&path);
    }

    fn rmdir(&mut self) {
        let empty: Vec<String> = self
            .model
            .dirs()
            .into_iter()
            // e2fsck wants /lost+found, so the model leaves it in place.
            .filter(|d| d != "/" && d != "/lost+found" && self.model.children(d).is_empty())
            .collect();
        let Some(path) = self.pick(&empty) else {
            return;
        };
        let (dir, name) = split(&path);
        self.fs.rmdir(self.ino(dir), name.as_bytes()).unwrap();
        self.model.paths.remove(&path);
    }

    fn rename(&mut self) {
        let all: Vec<String> = self
            .model
            .paths
            .keys()
            .filter(|p| *p != "/" && *p != "/lost+found")
            .cloned()
            .collect();
        let Some(src) = self.pick(&all) else { return };
        let dst_dir = self.pick(&self.model.dirs()).unwrap();
        if dst_dir == src || dst_dir.starts_with(&format!("{src}/")) {
            return;
        }
        // Over an existing compatible target sometimes, to a new name otherwise.
        let src_is_dir = matches!(self.model.nodes[&self.model.paths[&src]].kind, Kind::Dir);
        let targets: Vec<String> = self
            .model
            .children(&dst_dir)
            .into_iter()
            .filter(|t| {
                let is_dir = matches!(self.model.nodes[&self.model.paths[t]].kind, Kind::Dir);
                *t != src && is_dir == src_is_dir && (!is_dir || self.model.children(t).is_empty())
            })
            .collect();
        let dst = match (self.rng.gen_bool(0.3), self.pick(&targets)) {
            (true, Some(t)) => t,
            _ => join(&dst_dir, &self.fresh_name()),
        };
        if self.model.paths.get(&dst) == self.model.paths.get(&src) {
            return;
        }
        let (sd, sn) = split(&src);
        let (dd, dn) = split(&dst);
        self.fs
            .rename(
                self.ino(sd),
                sn.as_bytes(),
                self.ino(dd),
                dn.as_bytes(),
                RenameFlags::default(),
            )
            .unwrap();
        let moved: Vec<(String, usize)> = self
            .model
            .paths
            .iter()
            .filter(|(p, _)| **p == src || p.starts_with(&format!("{src}/")))
            .map(|(p, id)| (p.clone(), *id))
            .collect();
        self.model.paths.remove(&dst);
        for (p, id) in moved {
            self.model.paths.remove(&p);
            self.model
                .paths
                .insert(format!("{dst}{}", &p[src.len()..]), id);
        }
    }

    fn link(&mut self) {
        let Some(path) = self.pick(&self.model.files()) else {
            return;
        };
        let dir = self.pick(&self.model.dirs()).unwrap();
        let name = self.fresh_name();
        let ino = self.ino(&path);
        self.fs.link(ino, self.ino(&dir), name.as_bytes()).unwrap();
        let id = self.model.paths[&path];
        self.model.paths.insert(join(&dir, &name), id);
    }

    fn symlink(&mut self) {
        let dir = self.pick(&self.model.dirs()).unwrap();
        let name = self.fresh_name();
        let target = if self.rng.gen_bool(0.5) {
            "short/target".to_string()
        } else {
            format!("long/{}", "t".repeat(self.rng.gen_range(60..300)))
        };
        self.fs
            .symlink(self.ino(&dir), name.as_bytes(), target.as_bytes(), 0, 0)
            .unwrap();
        self.model.add(
            join(&dir, &name),
            Node {
                kind: Kind::Symlink(target.into_bytes()),
                perm: 0o777,
                xattrs: BTreeMap::new(),
            },
        );
    }

    fn xattr(&mut self) {
        let all: Vec<String> = self
            .model
            .paths
            .iter()
            .filter(|(_, id)| !matches!(self.model.nodes[id].kind, Kind::Symlink(_)))
            .map(|(p, _)| p.clone())
            .collect();
        let Some(path) = self.pick(&all) else { return };
        let id = self.model.paths[&path];
        let ino = self.ino(&path);
        let name = format!("user.k{}", self.rng.gen_range(0..6)).into_bytes();
        let node = self.model.nodes.get_mut(&id).unwrap();
        if self.rng.gen_bool(0.25) && node.xattrs.contains_key(&name) {
            self.fs.removexattr(ino, &name).unwrap();
            self.model.nodes.get_mut(&id).unwrap().xattrs.remove(&name);
        } else {
            let len = if self.rng.gen_bool(0.2) {
                self.rng.gen_range(100..400)
            } else {
                self.rng.gen_range(0..20)
            };
            let value = self.random_bytes(len);
            self.fs
                .setxattr(ino, &name, &value, XattrSetMode::Either)
                .unwrap();
            self.model
                .nodes
                .get_mut(&id)
                .unwrap()
                .xattrs
                .insert(name, value);
        }
    }

    fn chmod(&mut self) {
        let all: Vec<String> = self
            .model
            .paths
            .iter()
            .filter(|(_, id)| !matches!(self.model.nodes[id].kind, Kind::Symlink(_)))
            .map(|(p, _)| p.clone())
            .collect();
        let Some(path) = self.pick(&all) else { return };
        let perm: u32 = [0o640, 0o700, 0o755, 0o1777, 0o2755][self.rng.gen_range(0..5)];
        self.fs
            .setattr(
                self.ino(&path),
                &SetAttr {
                    perm: Some(perm as u16),
                    ..SetAttr::default()
                },
            )
            .unwrap();
        self.model
            .nodes
            .get_mut(&self.model.paths[&path])
            .unwrap()
            .perm = perm;
    }

    fn fallocate(&mut self) {
        let Some(path) = self.pick(&self.model.files()) else {
            return;
        };
        let id = self.model.paths[&path];
        let ino = self.ino(&path);
        let Kind::File(data) = &self.model.nodes[&id].kind else {
            unreachable!()
        };
        let size = data.len() as u64;
        let offset = self.rng.gen_range(0..size + 8192);
        let len = self.rng.gen_range(1..20_000u64);
        let punch = self.rng.gen_bool(0.5);
        let keep = punch || self.rng.gen_bool(0.5);
        trace(format!(
            "fallocate {path} at {offset} len {len} keep {keep} punch {punch} (size {size})"
        ));
        self.fs
            .fallocate(
                ino,
                offset,
                len,
                FallocateMode {
                    keep_size: keep,
                    punch_hole: punch,
                    zero_range: false,
                },
            )
            .unwrap();
        let Kind::File(data) = &mut self.model.nodes.get_mut(&id).unwrap().kind else {
            unreachable!()
        };
        if punch {
            let end = (offset + len).min(data.len() as u64);
            if offset < end {
                data[offset as usize..end as usize].fill(0);
            }
        } else if !keep && offset + len > data.len() as u64 {
            data.resize((offset + len) as usize, 0);
        }
    }

    /// Reads a file back at once (reads evict pages and read ahead in between writes).
    fn read_back(&mut self) {
        let Some(path) = self.pick(&self.model.files()) else {
            return;
        };
        let Kind::File(data) = &self.model.nodes[&self.model.paths[&path]].kind else {
            unreachable!()
        };
        let ino = self.ino(&path);
        trace(format!("read {path}"));
        let read = self.fs.read(ino, 0, data.len() + 1).unwrap();
        if read != *data {
            let at = read.iter().zip(data.iter()).position(|(a, b)| a != b);
            panic!(
                "read back {path}: {} bytes, expected {}, first difference at {at:?}; extents {:?}",
                read.len(),
                data.len(),
                self.fs.extents(ino).unwrap()
            );
        }
    }

    fn fsync(&mut self) {
        let all: Vec<String> = self
            .model
            .paths
            .iter()
            .filter(|(_, id)| !matches!(self.model.nodes[id].kind, Kind::Symlink(_)))
            .map(|(p, _)| p.clone())
            .collect();
        let Some(path) = self.pick(&all) else { return };
        let datasync = self.rng.gen_bool(0.5);
        trace(format!("fsync {path} datasync {datasync}"));
        self.fs.fsync(self.ino(&path), datasync).unwrap();
    }

    /// Makes a directory big enough to be indexed, and a file fragmented enough for a
    /// deep extent tree.
    fn big_structures(&mut self) {
        let dir = "/big".to_string();
        self.fs.mkdir(self.ino("/"), b"big", 0o755, 0, 0).unwrap();
        self.model.add(
            dir.clone(),
            Node {
                kind: Kind::Dir,
                perm: 0o755,
                xattrs: BTreeMap::new(),
            },
        );
        let parent = self.ino(&dir);
        for i in 0..900 {
            let name = format!("entry-with-a-fairly-long-name-{i:04}");
            self.fs
                .create(parent, name.as_bytes(), 0o644, 0, 0)
                .unwrap();
            self.model.add(
                join(&dir, &name),
                Node {
                    kind: Kind::File(Vec::new()),
                    perm: 0o644,
                    xattrs: BTreeMap::new(),
                },
            );
        }
        let a = self
            .fs
            .create(self.ino("/"), b"fragmented", 0o644, 0, 0)
            .unwrap()
            .ino;
        let b = self
            .fs
            .create(self.ino("/"), b"filler", 0o644, 0, 0)
            .unwrap()
            .ino;
        let bs = self.fs.statfs().unwrap().block_size as u64;
        let mut fa = Vec::new();
        let mut fb = Vec::new();
        for i in 0..700u64 {
            let chunk = vec![(i % 200) as u8 + 1; bs as usize];
            // Every other block: a hole between each, so each block is its own extent.
            self.fs.write(a, i * 2 * bs, &chunk).unwrap();
            self.fs.write(b, i * bs, &chunk).unwrap();
            self.fs.fsync(a, true).unwrap();
            fa.resize((i * 2 * bs) as usize, 0);
            fa.extend_from_slice(&chunk);
            fb.extend_from_slice(&chunk);
        }
        self.model.add(
            "/fragmented".into(),
            Node {
                kind: Kind::File(fa),
                perm: 0o644,
                xattrs: BTreeMap::new(),
            },
        );
        self.model.add(
            "/filler".into(),
            Node {
                kind: Kind::File(fb),
                perm: 0o644,
                xattrs: BTreeMap::new(),
            },
        );
        assert!(
            self.fs.extents(a).unwrap().len() >= 700,
            "one extent per block"
        );
    }
}

/// Checks the file system through jext against the model.
fn check_jext(fs: &Fs, model: &Model) {
    for (path, id) in &model.paths {
        let node = &model.nodes[id];
        let stat = fs.lookup_path(path);
        assert_eq!(stat.perm as u32, node.perm, "{path}: permissions");
        match &node.kind {
            Kind::File(data) => {
                assert_eq!(stat.kind, FileKind::Regular, "{path}");
                assert_eq!(stat.size, data.len() as u64, "{path}: size");
                let read = fs.read(stat.ino, 0, data.len() + 10).unwrap();
                if read != *data {
                    let at = read
                        .iter()
                        .zip(data.iter())
                        .position(|(a, b)| a != b)
                        .unwrap_or(0);
                    let show = |d: &[u8]| d[at..(at + 24).min(d.len())].to_vec();
                    let _ = fs.sync();
                    panic!(
                        "{path}: contents differ: read {} bytes, expected {}, first difference at {at}: read {:?} expected {:?}; extents {:?}",
                        read.len(), data.len(), show(&read), show(data), fs.extents(stat.ino).unwrap()
                    );
                }
                assert_eq!(stat.nlink as usize, model.links(*id), "{path}: link count");
            }
            Kind::Dir => {
                assert_eq!(stat.kind, FileKind::Directory, "{path}");
                let mut names: Vec<Vec<u8>> = Vec::new();
                let mut cookie = 0;
                // Fifty at a time, so listings resume from cookies.
                loop {
                    let batch = fs.readdir(stat.ino, cookie).unwrap();
                    if batch.is_empty() {
                        break;
                    }
                    for e in batch.into_iter().take(50) {
                        cookie = e.next_cookie;
                        names.push(e.name);
                    }
                }
                names.retain(|n| n != b"." && n != b"..");
                names.sort();
                let mut expected: Vec<Vec<u8>> = model
                    .children(path)
                    .iter()
                    .map(|c| split(c).1.as_bytes().to_vec())
                    .collect();
                expected.sort();
                assert_eq!(names, expected, "{path}: directory listing");
            }
            Kind::Symlink(target) => {
                assert_eq!(stat.kind, FileKind::Symlink, "{path}");
                assert_eq!(&fs.readlink(stat.ino).unwrap(), target, "{path}: target");
            }
        }
        if !matches!(node.kind, Kind::Symlink(_)) {
            let mut names = fs.listxattr(stat.ino).unwrap();
            names.sort();
            assert_eq!(
                names,
                node.xattrs.keys().cloned().collect::<Vec<_>>(),
                "{path}: xattr names"
            );
            for (k, v) in &node.xattrs {
                assert_eq!(
                    &fs.getxattr(stat.ino, k).unwrap(),
                    v,
                    "{path}: xattr {}",
                    String::from_utf8_lossy(k)
                );
            }
        }
    }
}

trait LookupPath {
    fn lookup_path(&self, path: &str) -> jext_fs::Stat;
}

impl LookupPath for Fs {
    fn lookup_path(&self, path: &str) -> jext_fs::Stat {
        self.stat(self.resolve(path).unwrap()).unwrap()
    }
}

/// Checks what Linux shows of the image against the model.
fn check_linux(mount: &LoopMount, model: &Model) {
    let mut inode_of: HashMap<usize, u64> = HashMap::new();
    for (path, id) in &model.paths {
        let host = mount.dir.join(path.trim_start_matches('/'));
        let meta =
            std::fs::symlink_metadata(&host).unwrap_or_else(|e| panic!("linux: {path}: {e}"));
        let node = &model.nodes[id];
        if let Some(ino) = inode_of.insert(*id, meta.ino()) {
            assert_eq!(ino, meta.ino(), "{path}: hard links share an inode");
        }
        match &node.kind {
            Kind::File(data) => {
                assert!(meta.is_file(), "{path}");
                assert_eq!(
                    meta.permissions().mode() & 0o7777,
                    node.perm,
                    "{path}: mode"
                );
                assert_eq!(meta.nlink() as usize, model.links(*id), "{path}: nlink");
                assert!(
                    std::fs::read(&host).unwrap() == *data,
                    "linux: {path}: contents differ"
                );
            }
            Kind::Dir => {
                assert!(meta.is_dir(), "{path}");
                assert_eq!(
                    meta.permissions().mode() & 0o7777,
                    node.perm,
                    "{path}: mode"
                );
                let mut names: Vec<String> = std::fs::read_dir(&host)
                    .unwrap()
                    .map(|e| e.unwrap().file_name().into_string().unwrap())
                    .collect();
                names.sort();
                let mut expected: Vec<String> = model
                    .children(path)
                    .iter()
                    .map(|c| split(c).1.to_string())
                    .collect();
                expected.sort();
                assert_eq!(names, expected, "linux: {path}: listing");
            }
            Kind::Symlink(target) => {
                assert_eq!(
                    std::fs::read_link(&host)
                        .unwrap()
                        .as_os_str()
                        .as_encoded_bytes(),
                    &target[..],
                    "{path}"
                );
            }
        }
    }
    let dump = run("python3", &["-c", XATTR_DUMP, mount.dir.to_str().unwrap()]);
    let mut seen: BTreeMap<String, BTreeMap<Vec<u8>, Vec<u8>>> = BTreeMap::new();
    for line in dump.lines() {
        let mut parts = line.split('\t');
        let (path, name, hex) = (
            parts.next().unwrap(),
            parts.next().unwrap(),
            parts.next().unwrap_or(""),
        );
        let value = (0..hex.len())
            .step_by(2)
            .map(|i| u8::from_str_radix(&hex[i..i + 2], 16).unwrap())
            .collect();
        seen.entry(path.to_string())
            .or_default()
            .insert(name.as_bytes().to_vec(), value);
    }
    for (path, id) in &model.paths {
        let expected = &model.nodes[id].xattrs;
        let got = seen.get(path).cloned().unwrap_or_default();
        assert_eq!(&got, expected, "linux: {path}: xattrs");
    }
}

const XATTR_DUMP: &str = r#"
import os, sys
root = sys.argv[1]
for d, dirs, files in os.walk(root):
    for p in [d] * (d == root) + [os.path.join(d, n) for n in dirs + files]:
        if os.path.islink(p):
            continue
        for a in os.listxattr(p, follow_symlinks=False):
            v = os.getxattr(p, a, follow_symlinks=False)
            rel = "/" + os.path.relpath(p, root) if p != root else "/"
            print(rel + "\t" + a + "\t" + v.hex())
"#;

/// `JEXT_MODEL_SEED` shifts every seed and `JEXT_MODEL_STEPS` sets the length, for long
/// explorations beyond CI's.
fn run_model(
    name: &str,
    mkfs_args: &[&str],
    size_mib: u64,
    mode: DataMode,
    seed: u64,
    steps: usize,
) {
    let env = |key: &str| std::env::var(key).ok().and_then(|v| v.parse::<u64>().ok());
    let seed = seed + env("JEXT_MODEL_SEED").unwrap_or(0) * 100;
    let steps = env("JEXT_MODEL_STEPS").map_or(steps, |s| s as usize);
    let scratch = Scratch::new(name);
    let image = scratch.path("model.img");
    mkfs_ext4(&image, size_mib, mkfs_args);
    // JEXT_MODEL_COMMIT_MS shortens the commit timer, so timer commits land between steps.
    let options = MountOptions {
        data_mode: mode,
        cache_size_bytes: 8 << 20,
        commit_interval_ms: env("JEXT_MODEL_COMMIT_MS").unwrap_or(5000),
        ..MountOptions::default()
    };
    let fs = Fs::open_path(&image, options.clone()).unwrap();
    let mut runner = Runner {
        fs: &fs,
        model: Model::new(),
        rng: StdRng::seed_from_u64(seed),
        names: 0,
    };
    // lost+found is mkfs's; the model leaves it alone.
    runner.big_structures();
    // JEXT_MODEL_CHECK_EACH=1 checks after every step, to find the first divergence.
    let check_each = std::env::var("JEXT_MODEL_CHECK_EACH").is_ok();
    for step in 0..steps {
        runner.step();
        if check_each {
            let result = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                check_jext(&fs, &runner.model)
            }));
            assert!(result.is_ok(), "diverged at step {step}");
        }
    }
    check_jext(&fs, &runner.model);
    fs.unmount().unwrap();
    assert_e2fsck_clean(&image);
    let again = Fs::open_path(&image, options).unwrap();
    check_jext(&again, &runner.model);
    again.unmount().unwrap();
    let mount = LoopMount::new(&image, &scratch.path("mnt"), "ro");
    check_linux(&mount, &runner.model);
}

#[test]
fn ordered_1k_blocks() {
    run_model("model-o1k", &[], 64, DataMode::Ordered, 1, 400);
}

#[test]
fn ordered_4k_blocks() {
    run_model("model-o4k", &["-b", "4096"], 128, DataMode::Ordered, 2, 400);
}

#[test]
fn journal_mode() {
    run_model("model-j", &[], 64, DataMode::Journal, 3, 300);
}

#[test]
fn writeback_mode() {
    run_model("model-w", &["-b", "4096"], 128, DataMode::Writeback, 4, 300);
}
