//! Several threads operating on one `Fs` at once, each checked against its own model.
//!
//! Each thread owns a home directory and the names it makes in a directory all threads
//! share; it creates, writes, truncates, renames (within its home, between its home and
//! the shared directory, over its own files), links, unlinks, makes and removes
//! directories, moves a directory of its own back and forth across parents, sets xattrs
//! and syncs, and checks the result of every operation against its model as it goes
//! (contents read back, sizes, link counts, what a lookup finds). Meanwhile the threads
//! contend for the shared directory, the allocator, the journal and the page cache. At
//! the end the whole tree must be the union of the models, in memory, after a remount, and
//! to `e2fsck -fn`; a Linux loop mount must show the same names and bytes.
//!
//! A watchdog fails the test if no thread makes progress for a minute (a deadlock would
//! otherwise hang the suite silently). `JEXT_CONCURRENT_STEPS` and `JEXT_CONCURRENT_SEED`
//! run it longer or differently.

mod common;

use common::{assert_e2fsck_clean, list_dir, mkfs_ext4, LoopMount, Scratch};
use jext_fs::{DataMode, FileKind, Fs, Ino, MountOptions, RenameFlags, SetAttr, XattrSetMode};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

const THREADS: usize = 4;
const SHARED: &str = "/shared";

/// What one thread made: file paths and their bytes, directory paths (all absolute).
#[derive(Default, Clone)]
struct Model {
    files: BTreeMap<String, Vec<u8>>,
    dirs: BTreeSet<String>,
}

struct Worker<'a> {
    fs: &'a Fs,
    me: usize,
    rng: StdRng,
    model: Model,
    names: u64,
    /// Where this thread's wandering directory is now (its home or the shared one).
    wanderer: String,
}

fn split(path: &str) -> (&str, &str) {
    let (dir, name) = path.rsplit_once('/').expect("absolute path");
    (if dir.is_empty() { "/" } else { dir }, name)
}

impl Worker<'_> {
    fn home(&self) -> String {
        format!("/t{}", self.me)
    }

    fn ino(&self, path: &str) -> Ino {
        self.fs
            .resolve(path)
            .unwrap_or_else(|e| panic!("thread {}: {path} should exist: {e}", self.me))
    }

    fn fresh_name(&mut self) -> String {
        self.names += 1;
        format!("t{}-n{}", self.me, self.names)
    }

    /// A directory this thread may make names in.
    fn some_dir(&mut self) -> String {
        let mut dirs: Vec<String> = self.model.dirs.iter().cloned().collect();
        dirs.push(SHARED.into());
        dirs[self.rng.gen_range(0..dirs.len())].clone()
    }

    fn some_file(&mut self) -> Option<String> {
        let files: Vec<&String> = self.model.files.keys().collect();
        (!files.is_empty()).then(|| files[self.rng.gen_range(0..files.len())].clone())
    }

    fn step(&mut self) {
        match self.rng.gen_range(0..100) {
            0..=19 => self.create(),
            20..=39 => self.write(),
            40..=44 => self.truncate(),
            45..=54 => self.rename_file(),
            55..=59 => self.link(),
            60..=69 => self.unlink(),
            70..=74 => self.mkdir(),
            75..=77 => self.rmdir(),
            78..=81 => self.wander(),
            82..=84 => self.xattr(),
            85..=91 => self.sync(),
            _ => self.check_one(),
        }
    }

    fn create(&mut self) {
        let dir = self.some_dir();
        let path = format!("{}/{}", dir.trim_end_matches('/'), self.fresh_name());
        let (parent, name) = split(&path);
        let parent = self.ino(parent);
        let st = self
            .fs
            .create(parent, name.as_bytes(), 0o644, 0, 0)
            .unwrap();
        assert_eq!((st.kind, st.size, st.nlink), (FileKind::Regular, 0, 1));
        self.model.files.insert(path, Vec::new());
    }

    fn write(&mut self) {
        let Some(path) = self.some_file() else { return };
        let ino = self.ino(&path);
        let len = self.model.files[&path].len();
        let offset = self.rng.gen_range(0..=len + 5000);
        let size = self.rng.gen_range(1..20_000);
        let byte = self.rng.gen::<u8>();
        let data = vec![byte; size];
        assert_eq!(self.fs.write(ino, offset as u64, &data).unwrap(), size);
        for name in self.names_of(&path) {
            let bytes = self.model.files.get_mut(&name).expect("a link of the file");
            if bytes.len() < offset + size {
                bytes.resize(offset + size, 0);
            }
            bytes[offset..offset + size].copy_from_slice(&data);
        }
    }

    fn truncate(&mut self) {
        let Some(path) = self.some_file() else { return };
        let ino = self.ino(&path);
        let size = self.rng.gen_range(0..30_000);
        let change = SetAttr {
            size: Some(size as u64),
            ..SetAttr::default()
        };
        self.fs.setattr(ino, &change).unwrap();
        for name in self.names_of(&path) {
            self.model.files.get_mut(&name).unwrap().resize(size, 0);
        }
    }

    /// Every path of the model that names the same inode as `path` (hard links).
    fn names_of(&self, path: &str) -> Vec<String> {
        let ino = self.ino(path);
        self.model
            .files
            .keys()
            .filter(|p| self.ino(p) == ino)
            .cloned()
            .collect()
    }

    fn rename_file(&mut self) {
        let Some(from) = self.some_file() else { return };
        // Over one of its own files now and then, else to a new name anywhere it owns.
        let to = match self.rng.gen_bool(0.3) {
            true => match self.some_file() {
                Some(to) if self.ino(&to) != self.ino(&from) => to,
                _ => return,
            },
            false => {
                let dir = self.some_dir();
                format!("{}/{}", dir.trim_end_matches('/'), self.fresh_name())
            }
        };
        let (sp, sn) = split(&from);
        let (dp, dn) = split(&to);
        let (sp, dp) = (self.ino(sp), self.ino(dp));
        self.fs
            .rename(sp, sn.as_bytes(), dp, dn.as_bytes(), RenameFlags::default())
            .unwrap();
        let bytes = self.model.files.remove(&from).unwrap();
        self.model.files.insert(to, bytes);
    }

    fn link(&mut self) {
        let Some(target) = self.some_file() else {
            return;
        };
        let dir = self.some_dir();
        let path = format!("{}/{}", dir.trim_end_matches('/'), self.fresh_name());
        let (parent, name) = split(&path);
        let ino = self.ino(&target);
        let before = self.names_of(&target).len() as u32;
        let st = self
            .fs
            .link(ino, self.ino(parent), name.as_bytes())
            .unwrap();
        assert_eq!(
            st.nlink,
            before + 1,
            "thread {}: links of {target}",
            self.me
        );
        let bytes = self.model.files[&target].clone();
        self.model.files.insert(path, bytes);
    }

    fn unlink(&mut self) {
        let Some(path) = self.some_file() else { return };
        let (parent, name) = split(&path);
        self.fs.unlink(self.ino(parent), name.as_bytes()).unwrap();
        self.model.files.remove(&path);
        assert!(self.fs.resolve(&path).is_err(), "{path} still resolves");
    }

    fn mkdir(&mut self) {
        let parent = self.home();
        let path = format!("{parent}/{}", self.fresh_name());
        let st = self
            .fs
            .mkdir(self.ino(&parent), split(&path).1.as_bytes(), 0o755, 0, 0)
            .unwrap();
        assert_eq!(st.kind, FileKind::Directory);
        self.model.dirs.insert(path);
    }

    fn rmdir(&mut self) {
        let home = self.home();
        let empty: Vec<String> = self
            .model
            .dirs
            .iter()
            .filter(|d| **d != home && **d != self.wanderer)
            .filter(|d| {
                let prefix = format!("{d}/");
                !self.model.files.keys().any(|f| f.starts_with(&prefix))
                    && !self.model.dirs.iter().any(|o| o.starts_with(&prefix))
            })
            .cloned()
            .collect();
        if empty.is_empty() {
            return;
        }
        let path = empty[self.rng.gen_range(0..empty.len())].clone();
        let (parent, name) = split(&path);
        self.fs.rmdir(self.ino(parent), name.as_bytes()).unwrap();
        self.model.dirs.remove(&path);
    }

    /// Moves this thread's own directory (and what it holds) between its home and the
    /// shared directory: renames between directories that other threads use at once.
    fn wander(&mut self) {
        let here = self.wanderer.clone();
        let there = match here.starts_with(SHARED) {
            true => format!("{}/wanderer", self.home()),
            false => format!("{SHARED}/t{}-wanderer", self.me),
        };
        let (sp, sn) = split(&here);
        let (dp, dn) = split(&there);
        let (sp, dp) = (self.ino(sp), self.ino(dp));
        self.fs
            .rename(sp, sn.as_bytes(), dp, dn.as_bytes(), RenameFlags::default())
            .unwrap();
        let moved = |p: &String| p == &here || p.starts_with(&format!("{here}/"));
        let rebase = |p: &String| format!("{there}{}", &p[here.len()..]);
        self.model.dirs = self
            .model
            .dirs
            .iter()
            .map(|d| if moved(d) { rebase(d) } else { d.clone() })
            .collect();
        self.model.files = std::mem::take(&mut self.model.files)
            .into_iter()
            .map(|(p, b)| if moved(&p) { (rebase(&p), b) } else { (p, b) })
            .collect();
        self.wanderer = there;
    }

    fn xattr(&mut self) {
        let Some(path) = self.some_file() else { return };
        let ino = self.ino(&path);
        let value = vec![self.me as u8; 40];
        self.fs
            .setxattr(ino, b"user.owner", &value, XattrSetMode::Either)
            .unwrap();
        assert_eq!(self.fs.getxattr(ino, b"user.owner").unwrap(), value);
    }

    fn sync(&mut self) {
        let Some(path) = self.some_file() else { return };
        let ino = self.ino(&path);
        match self.rng.gen_range(0..3) {
            0 => self.fs.fsync(ino, false).unwrap(),
            1 => self.fs.fsync(ino, true).unwrap(),
            _ => {
                let (parent, _) = split(&path);
                self.fs.fsync(self.ino(parent), false).unwrap()
            }
        }
    }

    fn check_one(&mut self) {
        let Some(path) = self.some_file() else { return };
        let ino = self.ino(&path);
        let want = &self.model.files[&path];
        let st = self.fs.stat(ino).unwrap();
        assert_eq!(
            st.size,
            want.len() as u64,
            "thread {}: size of {path}",
            self.me
        );
        let got = self.fs.read(ino, 0, want.len() + 1).unwrap();
        assert!(got == *want, "thread {}: bytes of {path}", self.me);
    }
}

/// Every file (with its bytes) and directory under `/`, lost+found aside.
fn tree(fs: &Fs) -> Model {
    let mut out = Model::default();
    let mut todo = vec![("/".to_string(), fs.root())];
    while let Some((path, ino)) = todo.pop() {
        for entry in list_dir(fs, ino) {
            let name = String::from_utf8(entry.name.clone()).unwrap();
            if name == "." || name == ".." || (path == "/" && name == "lost+found") {
                continue;
            }
            let child = format!("{}/{name}", path.trim_end_matches('/'));
            match entry.kind {
                FileKind::Directory => {
                    out.dirs.insert(child.clone());
                    todo.push((child, entry.ino));
                }
                FileKind::Regular => {
                    let size = fs.stat(entry.ino).unwrap().size as usize;
                    out.files
                        .insert(child, fs.read(entry.ino, 0, size).unwrap());
                }
                other => panic!("{child}: unexpected {other:?}"),
            }
        }
    }
    out
}

fn assert_same(got: &Model, want: &Model, when: &str) {
    assert_eq!(
        got.dirs, want.dirs,
        "{when}: directories differ from the models"
    );
    let got_names: Vec<&String> = got.files.keys().collect();
    let want_names: Vec<&String> = want.files.keys().collect();
    assert_eq!(got_names, want_names, "{when}: file names differ");
    for (path, bytes) in &want.files {
        assert!(got.files[path] == *bytes, "{when}: bytes of {path} differ");
    }
}

fn run_threads(name: &str, mode: DataMode, seed: u64, steps: usize) {
    let env = |key: &str| std::env::var(key).ok().and_then(|v| v.parse::<u64>().ok());
    let seed = seed + env("JEXT_CONCURRENT_SEED").unwrap_or(0) * 1000;
    let steps = env("JEXT_CONCURRENT_STEPS").map_or(steps, |s| s as usize);
    let scratch = Scratch::new(name);
    let image = scratch.path("fs.img");
    mkfs_ext4(&image, 256, &["-b", "4096"]);
    let options = MountOptions {
        data_mode: mode,
        // Small: the threads' writes push each other's pages out and throttle.
        cache_size_bytes: 8 << 20,
        commit_interval_ms: 200,
        ..MountOptions::default()
    };
    let fs = Fs::open_path(&image, options.clone()).unwrap();
    fs.mkdir(fs.root(), &SHARED.as_bytes()[1..], 0o777, 0, 0)
        .unwrap();
    let mut whole = Model::default();
    whole.dirs.insert(SHARED.into());
    let progress = AtomicU64::new(0);
    let done = AtomicBool::new(false);
    let models: Vec<Model> = std::thread::scope(|scope| {
        let workers: Vec<_> = (0..THREADS)
            .map(|me| {
                let (fs, progress) = (&fs, &progress);
                scope.spawn(move || {
                    let home = format!("/t{me}");
                    fs.mkdir(fs.root(), &home.as_bytes()[1..], 0o755, 0, 0)
                        .unwrap();
                    let wanderer = format!("{home}/wanderer");
                    fs.mkdir(fs.resolve(&home).unwrap(), b"wanderer", 0o755, 0, 0)
                        .unwrap();
                    let mut w = Worker {
                        fs,
                        me,
                        rng: StdRng::seed_from_u64(seed * 31 + me as u64),
                        model: Model::default(),
                        names: 0,
                        wanderer: wanderer.clone(),
                    };
                    w.model.dirs.insert(home);
                    w.model.dirs.insert(wanderer);
                    for _ in 0..steps {
                        w.step();
                        progress.fetch_add(1, Ordering::Relaxed);
                    }
                    w.model
                })
            })
            .collect();
        let watchdog = scope.spawn(|| watch(&progress, &done));
        let models = workers.into_iter().map(|w| w.join().unwrap()).collect();
        done.store(true, Ordering::Relaxed);
        watchdog.join().unwrap();
        models
    });
    for m in models {
        whole.files.extend(m.files);
        whole.dirs.extend(m.dirs);
    }
    assert_same(&tree(&fs), &whole, "after the threads");
    fs.unmount().unwrap();
    assert_e2fsck_clean(&image);
    let again = Fs::open_path(&image, options).unwrap();
    assert_same(&tree(&again), &whole, "after a remount");
    again.unmount().unwrap();
    let mount = LoopMount::new(&image, &scratch.path("mnt"), "ro");
    for (path, bytes) in &whole.files {
        let linux = std::fs::read(mount.path(&path[1..])).unwrap();
        assert!(linux == *bytes, "Linux reads {path} differently");
    }
    for dir in &whole.dirs {
        assert!(
            mount.path(&dir[1..]).is_dir(),
            "Linux lacks directory {dir}"
        );
    }
    mount.unmount();
}

/// Fails if the threads make no progress for a minute: a deadlock, named as one.
fn watch(progress: &AtomicU64, done: &AtomicBool) {
    let mut last = (progress.load(Ordering::Relaxed), Instant::now());
    while !done.load(Ordering::Relaxed) {
        std::thread::sleep(Duration::from_millis(200));
        let now = progress.load(Ordering::Relaxed);
        if now != last.0 {
            last = (now, Instant::now());
        }
        assert!(
            last.1.elapsed() < Duration::from_secs(60),
            "no operation finished for 60 s after {now} steps: the threads deadlocked"
        );
    }
}

#[test]
fn threads_in_ordered_mode_each_match_their_model() {
    run_threads("concurrent-o", DataMode::Ordered, 1, 400);
}

#[test]
fn threads_in_journal_mode_each_match_their_model() {
    run_threads("concurrent-j", DataMode::Journal, 2, 250);
}
