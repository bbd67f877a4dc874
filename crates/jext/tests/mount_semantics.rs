//! A jext mount behaves like a kernel file system's: one owner per image, `umount` that
//! returns with the image clean, `sync` that reaches the daemon, `remount,ro|rw`,
//! immutable and append-only enforced at every change, POSIX ACLs enforced, kept in step
//! with the mode and inherited, file handles that outlive the kernel's caches, and the
//! small things `stat` and mount(8) users rely on. Needs root and /dev/fuse (CI has both);
//! each test says it skipped where they are absent.

mod common;

use common::*;
use std::fs::{self, OpenOptions};
use std::io::Write;
use std::os::fd::AsRawFd;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{FileExt, MetadataExt, OpenOptionsExt};
use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

fn sh(program: &str, args: &[&str]) -> std::process::Output {
    Command::new(program)
        .args(args)
        .output()
        .unwrap_or_else(|e| panic!("cannot run {program} (scripts/setup installs it): {e}"))
}

fn ok(program: &str, args: &[&str]) -> String {
    let out = sh(program, args);
    assert!(
        out.status.success(),
        "{program} {args:?}: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// `umount` (the kernel's, not `jext umount`), tried again while busy (see `umount`).
fn kernel_umount(mnt: &Path, flags: &[&str]) {
    let mut args = flags.to_vec();
    args.push(p(mnt));
    retry_while_busy(&format!("umount {args:?}"), || sh("umount", &args));
}

fn errno_of<T>(r: std::io::Result<T>) -> Option<i32> {
    r.err().and_then(|e| e.raw_os_error())
}

fn p(path: &Path) -> &str {
    path.to_str().unwrap()
}

/// The line of /proc/mounts for `mnt`.
fn mount_line(mnt: &Path) -> String {
    fs::read_to_string("/proc/mounts")
        .unwrap()
        .lines()
        .find(|l| l.split(' ').nth(1) == Some(p(mnt)))
        .unwrap_or_else(|| panic!("{} is not mounted", mnt.display()))
        .to_string()
}

/// One owner per image: a second mount point of a mounted image shows the same file system
/// (one daemon, as a second mount of one ext4 device shares its superblock), and any other
/// writer is refused with the daemon named. Two daemons on one image used to hand out the
/// same inode numbers and lose one of two fsync'd files.
#[test]
fn a_second_mount_shares_the_file_system_and_other_writers_are_refused() {
    on_each_transport(|| {
        let s = Scratch::new("owner");
        mount(&s, "");
        let second = s.dir.join("second");
        fs::create_dir_all(&second).unwrap();
        jext(&["mount", p(&s.image()), p(&second)]);
        let data: Vec<u8> = (0..32u32 << 20).map(|i| (i % 253) as u8).collect();
        let f = fs::File::create(s.mnt().join("big")).unwrap();
        f.write_all_at(&data, 0).unwrap();
        f.sync_all().unwrap();
        drop(f);
        fs::write(second.join("small"), b"through the second mount point").unwrap();
        assert!(
            fs::read(second.join("big")).unwrap() == data,
            "one file system"
        );
        let src = s.dir.join("src");
        fs::write(&src, b"x").unwrap();
        let out = sh(JEXT, &["put", p(&src), p(&s.image()), "/put"]);
        let said = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "a second writer was let in");
        assert!(
            said.contains("in use") && said.contains("pid "),
            "the refusal names the daemon: {said}"
        );
        umount(&s);
        assert_eq!(
            fs::read(second.join("small")).unwrap(),
            b"through the second mount point",
            "the daemon serves on while a mount point remains"
        );
        jext(&["umount", p(&second)]);
        e2fsck_clean(&s.image());
        mount(&s, "");
        assert!(fs::read(s.mnt().join("big")).unwrap() == data);
        assert!(s.mnt().join("small").exists());
        umount(&s);
    });
}

/// A second mount point warns only when it asks the file system for options the first
/// mount did not give: the writeback cache is a FUSE option (fstests 604 and 732 compare
/// the mount's output and failed on a warning it did not deserve).
#[test]
fn a_second_mount_point_warns_only_of_file_system_options() {
    on_each_transport(|| {
        let s = Scratch::new("second-warning");
        mount(&s, "writeback_cache");
        let warned = |opts: &str, dir: &str| {
            let second = s.dir.join(dir);
            fs::create_dir_all(&second).unwrap();
            let out = sh(JEXT, &["mount", "-o", opts, p(&s.image()), p(&second)]);
            assert!(out.status.success(), "{out:?}");
            jext(&["umount", p(&second)]);
            String::from_utf8_lossy(&out.stderr).contains("options are those of its first mount")
        };
        assert!(!warned("writeback_cache", "second"));
        assert!(warned("data=journal", "third"));
        umount(&s);
    });
}

/// A directory removed while it is a process's working directory lives, as under ext4,
/// until the kernel lets it go: `stat .` inside shows it with no links and `cd ..` leaves
/// it (fstests generic/011's dirstress removes directories other processes stand in; jext
/// answered EIO, then ENOENT). Once left, the kernel forgets it and it is deleted: the
/// free inode count comes back before the unmount.
#[test]
fn a_removed_working_directory_lives_until_the_kernel_forgets_it() {
    on_each_transport(|| {
        let s = Scratch::new("removed-cwd");
        let daemon = foreground_daemon_heard(&s, "");
        let before = free_inodes(&s.mnt());
        let dir = s.mnt().join("d");
        // Removing `e` first drops what the kernel cached of `d`'s attributes, so `stat .`
        // and the permission check of `cd ..` ask the daemon.
        let script = format!(
            "mkdir -p {d}/e && cd {d} && rmdir e && rmdir {d} && stat -c links=%h . && cd .. && echo left=$?",
            d = p(&dir)
        );
        let out = sh("sh", &["-c", &script]);
        let said = String::from_utf8_lossy(&out.stdout);
        assert!(
            said.contains("links=0") && said.contains("left=0"),
            "the removed working directory: {out:?}"
        );
        let after = free_inodes_settled(&s.mnt(), before);
        assert_eq!(after, before, "the directory was not deleted once left");
        umount_clean_without_eio(&s, daemon);
    });
}

/// `open(2)` with `O_TMPFILE` makes a file with no name, as on ext4: `linkat` with
/// `AT_EMPTY_PATH` names it, and one closed unnamed is gone (its inode free again). The
/// kernel asks with FUSE_TMPFILE, which jext's fuser answers (JEXT-PATCHES item 10);
/// without it the open failed with EOPNOTSUPP.
#[test]
fn an_o_tmpfile_file_is_named_by_linkat_or_gone_at_close() {
    on_each_transport(|| {
        let s = Scratch::new("tmpfile");
        mount(&s, "");
        let before = free_inodes(&s.mnt());
        let unnamed = |mode: u32| {
            OpenOptions::new()
                .read(true)
                .write(true)
                .mode(mode)
                .custom_flags(libc::O_TMPFILE)
                .open(s.mnt())
                .expect("O_TMPFILE")
        };
        let kept = unnamed(0o640);
        kept.write_all_at(b"made without a name", 0).unwrap();
        assert_eq!(kept.metadata().unwrap().nlink(), 0);
        let target = std::ffi::CString::new(s.mnt().join("kept").as_os_str().as_bytes()).unwrap();
        // SAFETY: a valid descriptor, an empty C string and a NUL-terminated path that
        // outlive the call.
        let linked = unsafe {
            libc::linkat(
                kept.as_raw_fd(),
                c"".as_ptr(),
                libc::AT_FDCWD,
                target.as_ptr(),
                libc::AT_EMPTY_PATH,
            )
        };
        assert_eq!(linked, 0, "linkat: {}", std::io::Error::last_os_error());
        drop(kept);
        assert_eq!(
            fs::read(s.mnt().join("kept")).unwrap(),
            b"made without a name"
        );
        let mode = fs::metadata(s.mnt().join("kept")).unwrap().mode();
        assert_eq!(mode & 0o700, 0o600, "mode {mode:o}");
        // Closed while an O_PATH descriptor still has it: it lives on, and `linkat`
        // through the descriptor names it, as on ext4.
        let late = unnamed(0o600);
        late.write_all_at(b"named after its close", 0).unwrap();
        let fd_path = format!("/proc/self/fd/{}", late.as_raw_fd());
        let path_only = OpenOptions::new()
            .read(true)
            .custom_flags(libc::O_PATH)
            .open(&fd_path)
            .unwrap();
        drop(late);
        let from = std::ffi::CString::new(format!("/proc/self/fd/{}", path_only.as_raw_fd()));
        let to = std::ffi::CString::new(s.mnt().join("late").as_os_str().as_bytes()).unwrap();
        // SAFETY: NUL-terminated paths that outlive the call.
        let linked = unsafe {
            libc::linkat(
                libc::AT_FDCWD,
                from.unwrap().as_ptr(),
                libc::AT_FDCWD,
                to.as_ptr(),
                libc::AT_SYMLINK_FOLLOW,
            )
        };
        assert_eq!(
            linked,
            0,
            "linkat after close: {}",
            std::io::Error::last_os_error()
        );
        drop(path_only);
        assert_eq!(
            fs::read(s.mnt().join("late")).unwrap(),
            b"named after its close"
        );
        let gone = unnamed(0o600);
        gone.write_all_at(&[1; 100_000], 0).unwrap();
        drop(gone);
        // The last close's RELEASE reaches the daemon after `close` returned.
        let after = free_inodes_settled(&s.mnt(), before - 2);
        assert_eq!(after, before - 2, "only the named ones stay");
        umount(&s);
        e2fsck_clean(&s.image());
    });
}

/// The file system's free inodes, as `df -i` shows them.
fn free_inodes(dir: &Path) -> u64 {
    let out = sh("stat", &["-f", "-c", "%d", p(dir)]);
    String::from_utf8_lossy(&out.stdout).trim().parse().unwrap()
}

/// The free inodes once they reach `expected`, or after 10 s: a deletion that follows a
/// FORGET or a RELEASE, which the kernel sends without waiting for the daemon.
fn free_inodes_settled(dir: &Path, expected: u64) -> u64 {
    let deadline = Instant::now() + Duration::from_secs(10);
    while free_inodes(dir) != expected && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(20));
    }
    free_inodes(dir)
}

/// The issue's scenario: `umount` returning before the daemon's checkpoint let a new mount
/// race the old daemon and e2fsck see half-written counts.
#[test]
fn plain_umount_leaves_a_clean_image_fifty_times_over() {
    on_each_transport(|| {
        let s = Scratch::new("cycles");
        mount(&s, "");
        assert!(
            mount_line(&s.mnt()).contains("fuseblk.jext"),
            "mounted as fuseblk: {}",
            mount_line(&s.mnt())
        );
        for cycle in 0..50u32 {
            let data: Vec<u8> = (0..32u32 << 20)
                .map(|i| (i.wrapping_mul(31) ^ cycle) as u8)
                .collect();
            let name = format!("c{}", cycle % 3);
            fs::write(s.mnt().join(&name), &data).unwrap();
            kernel_umount(&s.mnt(), &[]);
            e2fsck_clean(&s.image());
            mount(&s, "");
            assert!(
                fs::read(s.mnt().join(&name)).unwrap() == data,
                "cycle {cycle}: {name} differs after umount and mount"
            );
        }
        umount(&s);
        e2fsck_clean(&s.image());
    });
}

/// A plain `fuse` mount's `umount` returns before its daemon has checkpointed; a mount of
/// the same image right then waits for that daemon to let go instead of failing (as a
/// kernel mount waits for an unmount of its device; fstests generic/604).
#[test]
fn a_mount_racing_an_unmount_waits_for_the_daemon() {
    on_each_transport(|| {
        let s = Scratch::new("race");
        for round in 0..5u32 {
            mount(&s, "noblkdev");
            let data = vec![round as u8 + 1; 16 << 20];
            fs::write(s.mnt().join("f"), &data).unwrap();
            // The kernel's own unmount, not `jext umount`, which would wait.
            kernel_umount(&s.mnt(), &["-i"]);
            mount(&s, "noblkdev");
            assert!(
                fs::read(s.mnt().join("f")).unwrap() == data,
                "round {round}"
            );
            umount(&s);
        }
        e2fsck_clean(&s.image());
    });
}

/// `sync` (and `syncfs` on the mount) reach the daemon: what was written before survives
/// SIGKILL of the daemon, what came after does not.
#[test]
fn sync_reaches_the_daemon() {
    on_each_transport(|| {
        for (how, args) in [("sync", vec![]), ("sync -f", vec!["-f"])] {
            let s = Scratch::new(&format!("sync{}", args.len()));
            let daemon = foreground_daemon(&s, "commit=3600,writeback_cache");
            let synced: Vec<u8> = (0..300_000u32).map(|i| (i % 251) as u8).collect();
            fs::write(s.mnt().join("synced"), &synced).unwrap();
            let mut sync_args = args.clone();
            let mnt = s.mnt();
            sync_args.push(p(&mnt));
            ok("sync", if args.is_empty() { &[] } else { &sync_args });
            fs::write(s.mnt().join("unsynced"), b"lost with the daemon").unwrap();
            kill_daemon(daemon);
            unmount_dead(&s);
            let image = s.image();
            let read_back = sh(JEXT, &["cat", p(&image), "/synced"]);
            assert!(read_back.stdout == synced, "{how}: the synced file differs");
            let ls = ok(JEXT, &["ls", p(&image), "/"]);
            assert!(!ls.contains("unsynced"), "{how}: {ls}");
        }
    });
}

#[test]
fn remount_read_only_and_back() {
    on_each_transport(|| {
        let s = Scratch::new("remount");
        mount(&s, "");
        let f = fs::File::create(s.mnt().join("written")).unwrap();
        f.write_all_at(&[5u8; 200_000], 0).unwrap();
        drop(f);
        let remount = |opts: &str| jext(&["mount", "-o", opts, p(&s.image()), p(&s.mnt())]);
        remount("remount,ro");
        assert!(
            mount_line(&s.mnt()).contains(" ro,"),
            "{}",
            mount_line(&s.mnt())
        );
        assert_eq!(
            errno_of(fs::write(s.mnt().join("x"), b"x")),
            Some(libc::EROFS)
        );
        // Read-only after a commit and checkpoint: the image is clean while still mounted.
        e2fsck_clean(&s.image());
        assert_eq!(
            fs::read(s.mnt().join("written")).unwrap(),
            vec![5u8; 200_000]
        );
        remount("remount,rw");
        fs::write(s.mnt().join("after"), b"after").unwrap();
        if Path::new("/usr/sbin/mount.fuseblk.jext").exists() {
            ok("mount", &["-o", "remount,ro", p(&s.mnt())]);
            e2fsck_clean(&s.image());
            ok("mount", &["-o", "remount,rw", p(&s.mnt())]);
        } else {
            eprintln!(
                "SKIPPED part: mount(8) remount needs /usr/sbin/mount.fuseblk.jext (scripts/setup)"
            );
        }
        umount(&s);
        e2fsck_clean(&s.image());
        let ls = ok(JEXT, &["ls", p(&s.image()), "/"]);
        assert!(ls.contains("after") && ls.contains("written"), "{ls}");
    });
}

#[test]
fn immutable_and_append_only_hold_for_descriptors_opened_before() {
    on_each_transport(|| {
        let s = Scratch::new("flags");
        mount(&s, "");
        let path = s.mnt().join("f");
        fs::write(&path, b"0123456789").unwrap();
        let old = OpenOptions::new()
            .read(true)
            .write(true)
            .open(&path)
            .unwrap();
        let ctime = |m: fs::Metadata| (m.ctime(), m.ctime_nsec());
        let before = ctime(fs::metadata(&path).unwrap());
        ok("chattr", &["+i", p(&path)]);
        // chattr moved ctime, and stat shows it at once (not after the attribute cache ages).
        let after = ctime(fs::metadata(&path).unwrap());
        assert!(
            after > before,
            "stat still shows the ctime from before chattr"
        );
        assert_eq!(errno_of(old.write_all_at(b"x", 0)), Some(libc::EPERM));
        assert_eq!(errno_of(old.write_all_at(b"x", 10)), Some(libc::EPERM));
        assert_eq!(errno_of(old.set_len(2)), Some(libc::EPERM));
        let xattr = sh("setfattr", &["-n", "user.k", "-v", "v", p(&path)]);
        assert!(!xattr.status.success(), "setfattr on an immutable file");
        let acl = sh("setfacl", &["-m", "u:1000:r", p(&path)]);
        assert!(!acl.status.success(), "setfacl on an immutable file");
        assert!(
            !sh("touch", &[p(&path)]).status.success(),
            "touch of immutable"
        );
        ok("chattr", &["-i", "+a", p(&path)]);
        assert_eq!(errno_of(old.write_all_at(b"x", 0)), Some(libc::EPERM));
        old.write_all_at(b"ab", 10).unwrap();
        let mut appender = OpenOptions::new().append(true).open(&path).unwrap();
        appender.write_all(b"cd").unwrap();
        ok("touch", &[p(&path)]);
        assert!(
            !sh("touch", &["-d", "2001-01-01", p(&path)])
                .status
                .success(),
            "times of one's choice on an append-only file"
        );
        assert!(!sh("setfattr", &["-n", "user.k", "-v", "v", p(&path)])
            .status
            .success());
        assert_eq!(errno_of(fs::remove_file(&path)), Some(libc::EPERM));
        ok("chattr", &["-a", p(&path)]);
        assert_eq!(fs::read(&path).unwrap(), b"0123456789abcd");
        // DAX is kept, as Linux ext4 keeps it on a device without DAX.
        ok("chattr", &["+x", p(&path)]);
        let has_flag = |path: &Path, flag: char| {
            let listed = ok("lsattr", &["-d", p(path)]);
            listed.split(' ').next().unwrap().contains(flag)
        };
        assert!(has_flag(&path, 'x'));
        // ... and new inodes take it from their directory (ext4's inherited flags).
        let dir = s.mnt().join("inherits");
        fs::create_dir(&dir).unwrap();
        ok("chattr", &["+x", p(&dir)]);
        fs::write(dir.join("child"), b"c").unwrap();
        assert!(has_flag(&dir.join("child"), 'x'));
        drop((old, appender));
        umount(&s);
        e2fsck_clean(&s.image());
    });
}

/// With the writeback cache the kernel sends an append as its whole page and the times of
/// its writes later, in a setattr: both reach an append-only file and must be taken as
/// the append they are (fstests generic/079: the write returned, and the bytes were lost
/// to EIO at writeback). Times of one's choice stay refused.
#[test]
fn an_append_only_file_takes_appends_through_the_writeback_cache() {
    on_each_transport(|| {
        let s = Scratch::new("append-wb");
        mount(&s, "writeback_cache");
        let path = s.mnt().join("log");
        fs::write(&path, b"original-content\n").unwrap();
        ok("chattr", &["+a", p(&path)]);
        for line in [&b"appended\n"[..], b"more\n"] {
            let mut appender = OpenOptions::new().append(true).open(&path).unwrap();
            appender.write_all(line).unwrap();
            appender.sync_all().unwrap();
        }
        assert_eq!(
            fs::read(&path).unwrap(),
            b"original-content\nappended\nmore\n"
        );
        assert_eq!(
            errno_of(OpenOptions::new().write(true).open(&path)),
            Some(libc::EPERM),
            "opened for writing without O_APPEND"
        );
        assert!(
            !sh("touch", &["-d", "2001-01-01", p(&path)])
                .status
                .success(),
            "times of one's choice on an append-only file"
        );
        ok("chattr", &["-a", p(&path)]);
        umount(&s);
        e2fsck_clean(&s.image());
    });
}

/// With the writeback cache the kernel sends a file's cached times when it writes the
/// inode back. For a file written, closed and deleted (SQLite's rollback journal, every
/// transaction; GNU tar's placeholders for links) that may come after jext freed the
/// inode: jext answered EIO, "inode N is not in use", as for an inconsistency, and then
/// ENOENT, which the kernel kept as a writeback error that the next `syncfs` of the
/// mount reported (`tar -x` then `sync -f` failed). The times have nowhere to go and are
/// dropped.
#[test]
fn a_deleted_files_cached_times_are_dropped_not_an_inconsistency() {
    on_each_transport(|| {
        let s = Scratch::new("wb-deleted-times");
        let daemon = foreground_daemon_heard(&s, "writeback_cache");
        for i in 0..20 {
            let path = s.mnt().join(format!("journal-{i}"));
            let mut f = fs::File::create(&path).unwrap();
            f.write_all(b"a page image").unwrap();
            f.sync_all().unwrap();
            drop(f);
            fs::remove_file(&path).unwrap();
        }
        // And files deleted while still open, closed after.
        for i in 0..20 {
            let path = s.mnt().join(format!("placeholder-{i}"));
            let f = fs::File::create(&path).unwrap();
            (&f).write_all(b"x").unwrap();
            fs::remove_file(&path).unwrap();
            drop(f);
        }
        let mnt = s.mnt();
        ok("sync", &["-f", p(&mnt)]);
        umount_clean_without_eio(&s, daemon);
    });
}

/// fstests generic/423 under the writeback cache: the kernel stamps a regular file's ctime
/// on `link` from its coarse clock, so jext's own stamps (a FIFO made just before) must not
/// be exact times later than that clock. Before the fix nearly every iteration inverted.
#[test]
fn a_link_made_after_a_node_never_shows_an_older_ctime_under_the_writeback_cache() {
    on_each_transport(|| {
        let s = Scratch::new("wb-link-ctime");
        let daemon = foreground_daemon_heard(&s, "writeback_cache");
        let dir = s.mnt();
        let file = dir.join("file");
        fs::write(&file, vec![0u8; 20480]).unwrap();
        let mut inverted = 0;
        for i in 0..200 {
            let (node, link) = (dir.join(format!("fifo{i}")), dir.join(format!("link{i}")));
            // Someone reads the times first: that is what asks for exact stamps.
            fs::metadata(&dir).unwrap();
            fs::metadata(&file).unwrap();
            ok("mkfifo", &[p(&node)]);
            let made = fs::metadata(&node).unwrap();
            fs::hard_link(&file, &link).unwrap();
            let linked = fs::metadata(&link).unwrap();
            let ctime_ns =
                |m: &fs::Metadata| m.ctime() as i128 * 1_000_000_000 + m.ctime_nsec() as i128;
            if ctime_ns(&linked) < ctime_ns(&made) {
                inverted += 1;
            }
            fs::remove_file(&node).unwrap();
            fs::remove_file(&link).unwrap();
        }
        assert_eq!(
            inverted, 0,
            "of 200 links, {inverted} showed a ctime before the FIFO made first"
        );
        umount(&s);
        daemon.wait_with_output().unwrap();
        e2fsck_clean(&s.image());
    });
}

/// Unmounts a foreground daemon's mount, checks that the daemon never answered EIO, and
/// that the image is clean.
fn umount_clean_without_eio(s: &Scratch, daemon: std::process::Child) {
    umount(s);
    let out = daemon.wait_with_output().unwrap();
    let said = String::from_utf8_lossy(&out.stderr);
    assert!(!said.contains("EIO"), "the daemon said: {said}");
    e2fsck_clean(&s.image());
}

fn copy_file_range(from: &fs::File, from_at: i64, to: &fs::File, to_at: i64, len: usize) -> i64 {
    let (mut from_at, mut to_at) = (from_at, to_at);
    // SAFETY: both descriptors are open for the call, and the offsets are locals it may
    // move; no buffer of ours is handed over.
    unsafe {
        libc::copy_file_range(
            from.as_raw_fd(),
            &mut from_at,
            to.as_raw_fd(),
            &mut to_at,
            len,
            0,
        ) as i64
    }
}

/// With the writeback cache, what a program just wrote may be only in the kernel's pages.
/// `copy_file_range` reaches jext, which refuses an immutable target (fstests generic/553),
/// and SEEK_DATA / SEEK_HOLE never answer a hole where unwritten-back data is (the
/// kernel answers them: fstests' seek_sanity_test found ENXIO after a one-byte write).
/// The same checks hold without the cache.
#[test]
fn copies_and_seeks_see_data_still_in_the_kernel_cache() {
    on_each_transport(|| {
        for options in ["writeback_cache", "nowriteback_cache"] {
            let s = Scratch::new("copy-seek");
            mount(&s, options);
            let (src, dst) = (s.mnt().join("src"), s.mnt().join("dst"));
            let data: Vec<u8> = (0..300_000u32).map(|i| (i % 251) as u8).collect();
            fs::write(&src, &data).unwrap();
            fs::write(&dst, b"").unwrap();
            let from = fs::File::open(&src).unwrap();
            let to = OpenOptions::new().write(true).open(&dst).unwrap();
            assert_eq!(
                copy_file_range(&from, 1000, &to, 0, 1 << 20),
                299_000,
                "{options}"
            );
            to.sync_all().unwrap();
            assert_eq!(fs::read(&dst).unwrap(), &data[1000..], "{options}");

            ok("chattr", &["+i", p(&dst)]);
            assert_eq!(copy_file_range(&from, 0, &to, 0, 4096), -1, "{options}");
            assert_eq!(
                std::io::Error::last_os_error().raw_os_error(),
                Some(libc::EPERM),
                "{options}: copy into an immutable file"
            );
            ok("chattr", &["-i", p(&dst)]);

            let sparse = OpenOptions::new()
                .create(true)
                .truncate(true)
                .read(true)
                .write(true)
                .open(s.mnt().join("sparse"))
                .unwrap();
            sparse.write_all_at(b"x", 1 << 20).unwrap();
            // SAFETY: plain lseek on a descriptor this test holds open.
            let data_at = unsafe { libc::lseek(sparse.as_raw_fd(), 0, libc::SEEK_DATA) };
            assert!(
                (0..=1 << 20).contains(&data_at),
                "{options}: SEEK_DATA skipped the byte just written ({data_at})"
            );
            // SAFETY: as above.
            let hole_at = unsafe { libc::lseek(sparse.as_raw_fd(), data_at, libc::SEEK_HOLE) };
            assert!(hole_at > 1 << 20, "{options}: SEEK_HOLE at {hole_at}");
            drop((from, to, sparse));
            umount(&s);
            e2fsck_clean(&s.image());
        }
    });
}

/// `chattr` through the mount asks for what ext4 asks for: the owner (or CAP_FOWNER) to
/// change a file's flags, CAP_LINUX_IMMUTABLE for `i` and `a`, CAP_SYS_RESOURCE for `j`
/// (data journaling); EPERM otherwise. The kernel leaves these checks to the FUSE server.
#[test]
fn flag_changes_ask_for_the_capabilities_ext4_asks_for() {
    on_each_transport(|| {
        let s = Scratch::new("flagcaps");
        mount(&s, "allow_other");
        let path = s.mnt().join("f");
        fs::write(&path, b"data").unwrap();
        ok("chown", &["65534:65534", p(&path)]);
        let chattr_as = |setpriv: &[&str], flag: &str| {
            let mut args = setpriv.to_vec();
            args.extend(["chattr", flag, p(&path)]);
            sh("setpriv", &args)
        };
        let nobody = [
            "--reuid=65534",
            "--regid=65534",
            "--clear-groups",
            "--inh-caps=-all",
        ];
        let root_without = |cap: &'static str| {
            let bounding = format!("--bounding-set=-{cap}");
            ["--inh-caps=-all".to_string(), bounding]
        };
        let refused = |out: std::process::Output, what: &str| {
            assert!(!out.status.success(), "{what} was allowed");
            let stderr = String::from_utf8_lossy(&out.stderr);
            assert!(stderr.contains("not permitted"), "{what}: {stderr}");
        };
        // The owner may set flags that need no capability, and nothing more.
        assert!(
            chattr_as(&nobody, "+d").status.success(),
            "the owner sets nodump"
        );
        refused(
            chattr_as(&nobody, "+j"),
            "j by an owner without CAP_SYS_RESOURCE",
        );
        refused(
            chattr_as(&nobody, "+i"),
            "i by an owner without CAP_LINUX_IMMUTABLE",
        );
        for (cap, flag) in [("sys_resource", "+j"), ("linux_immutable", "+a")] {
            let args = root_without(cap);
            let args: Vec<&str> = args.iter().map(String::as_str).collect();
            refused(
                chattr_as(&args, flag),
                &format!("{flag} by root without {cap}"),
            );
        }
        ok("chown", &["0:0", p(&path)]);
        refused(chattr_as(&nobody, "-d"), "a flag change by someone else");
        if has_capability(CAP_SYS_RESOURCE) {
            ok("chattr", &["+j", p(&path)]);
            ok("chattr", &["-j", p(&path)]);
        } else {
            eprintln!(
                "SKIPPED part: chattr +j by a caller with CAP_SYS_RESOURCE (this process lacks it)"
            );
            refused(
                sh("chattr", &["+j", p(&path)]),
                "j by root without CAP_SYS_RESOURCE",
            );
        }
        ok("chattr", &["-d", p(&path)]);
        umount(&s);
        e2fsck_clean(&s.image());
    });
}

/// Runs `args` as uid and gid 1000 (no supplementary groups); whether it succeeded.
fn as_user_1000(args: &[&str]) -> bool {
    let mut all = vec!["--reuid=1000", "--regid=1000", "--clear-groups", "--"];
    all.extend_from_slice(args);
    sh("setpriv", &all).status.success()
}

#[test]
fn posix_acls_are_enforced_kept_with_the_mode_and_inherited() {
    on_each_transport(|| {
        let s = Scratch::new("acl");
        mount(&s, "allow_other");
        let file = s.mnt().join("secret");
        fs::write(&file, b"for user 1000 only").unwrap();
        fs::set_permissions(&file, std::os::unix::fs::PermissionsExt::from_mode(0o640)).unwrap();
        assert!(
            !as_user_1000(&["cat", p(&file)]),
            "0640 root:root keeps 1000 out"
        );
        ok("setfacl", &["-m", "u:1000:r", p(&file)]);
        assert!(
            as_user_1000(&["cat", p(&file)]),
            "the named-user entry lets 1000 read"
        );
        // The mask shows in the mode's group bits, and chmod moves the mask.
        let mode = fs::metadata(&file).unwrap().mode() & 0o777;
        assert_eq!(mode, 0o640, "mask r-- keeps group bits r--");
        fs::set_permissions(&file, std::os::unix::fs::PermissionsExt::from_mode(0o600)).unwrap();
        let acl = ok("getfacl", &["-cn", p(&file)]);
        assert!(acl.contains("mask::---"), "chmod rewrote the mask: {acl}");
        assert!(
            !as_user_1000(&["cat", p(&file)]),
            "the mask now denies 1000"
        );
        // An ACL that says no more than a mode is dropped for the mode.
        ok("setfacl", &["-b", p(&file)]);
        ok("setfacl", &["-m", "u::rwx,g::r-x,o::r--", p(&file)]);
        assert_eq!(fs::metadata(&file).unwrap().mode() & 0o777, 0o754);
        let names = ok("getfattr", &["-d", "-m", "-", p(&file)]);
        assert!(!names.contains("posix_acl_access"), "{names}");
        // Default ACLs: inherited by new files (instead of the umask) and directories.
        let dir = s.mnt().join("shared");
        fs::create_dir(&dir).unwrap();
        ok("setfacl", &["-d", "-m", "u:1000:rwx", p(&dir)]);
        ok("setfacl", &["-m", "u:1000:rwx", p(&dir)]);
        let child = dir.join("new");
        fs::write(&child, b"inherited").unwrap();
        let acl = ok("getfacl", &["-cn", p(&child)]);
        // Named entries keep their bits; the mask takes what the mode (0666) allows.
        assert!(
            acl.contains("user:1000:rwx") && acl.contains("mask::rw-"),
            "a new file inherits: {acl}"
        );
        assert!(as_user_1000(&[
            "sh",
            "-c",
            &format!("echo more >> {}", p(&child))
        ]));
        let sub = dir.join("sub");
        fs::create_dir(&sub).unwrap();
        let acl = ok("getfacl", &["-cn", "-d", p(&sub)]);
        assert!(
            acl.contains("user:1000:rwx"),
            "a new directory inherits the default: {acl}"
        );
        umount(&s);
        e2fsck_clean(&s.image());
        // Stored as ext4 stores ACLs: Linux reads the same entries.
        let linux = s.dir.join("linux");
        fs::create_dir_all(&linux).unwrap();
        ok("mount", &["-o", "loop,ro", p(&s.image()), p(&linux)]);
        let seen = sh("getfacl", &["-cn", p(&linux.join("shared/new"))]);
        ok("umount", &[p(&linux)]);
        assert!(
            String::from_utf8_lossy(&seen.stdout).contains("user:1000:rwx"),
            "Linux reads jext's ACL: {}",
            String::from_utf8_lossy(&seen.stdout)
        );
    });
}

/// A file handle (`name_to_handle_at`) as 8 bytes of header and up to 128 of handle.
struct Handle {
    words: [u64; 17],
    mount_id: libc::c_int,
}

fn handle_of(path: &Path) -> Handle {
    let mut h = Handle {
        words: [0; 17],
        mount_id: 0,
    };
    h.words[0] = 128; // handle_bytes (u32), handle_type (i32) = 0
    let c = std::ffi::CString::new(path.as_os_str().as_bytes()).unwrap();
    // SAFETY: the buffer is 8 + 128 bytes, aligned, and says it has room for 128 bytes of
    // handle; the path is NUL-terminated; both outlive the call.
    let rc = unsafe {
        libc::name_to_handle_at(
            libc::AT_FDCWD,
            c.as_ptr(),
            h.words.as_mut_ptr().cast(),
            &mut h.mount_id,
            0,
        )
    };
    assert_eq!(
        rc,
        0,
        "name_to_handle_at: {}",
        std::io::Error::last_os_error()
    );
    h
}

fn open_by_handle(mount: &fs::File, h: &mut Handle) -> std::io::Result<fs::File> {
    // SAFETY: the handle buffer came from name_to_handle_at and outlives the call.
    let fd = unsafe {
        libc::open_by_handle_at(
            mount.as_raw_fd(),
            h.words.as_mut_ptr().cast(),
            // CLOEXEC: a daemon another test spawns meanwhile must not inherit this
            // descriptor, or it keeps the mount busy for its whole life.
            libc::O_RDONLY | libc::O_CLOEXEC,
        )
    };
    if fd < 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: a descriptor open_by_handle_at just returned, owned by nobody else.
    Ok(unsafe { <fs::File as std::os::fd::FromRawFd>::from_raw_fd(fd) })
}

fn drop_caches() {
    fs::write("/proc/sys/vm/drop_caches", "3").unwrap();
}

#[test]
fn file_handles_survive_dropped_caches() {
    on_each_transport(|| {
        let s = Scratch::new("handles");
        mount(&s, "");
        fs::create_dir(s.mnt().join("d")).unwrap();
        fs::write(s.mnt().join("d/kept"), b"by handle").unwrap();
        fs::write(s.mnt().join("gone"), b"deleted").unwrap();
        let mut kept = handle_of(&s.mnt().join("d/kept"));
        let mut dir = handle_of(&s.mnt().join("d"));
        let mut gone = handle_of(&s.mnt().join("gone"));
        fs::remove_file(s.mnt().join("gone")).unwrap();
        drop_caches();
        let root = fs::File::open(s.mnt()).unwrap();
        let f = open_by_handle(&root, &mut kept).expect("open_by_handle_at after drop_caches");
        let mut buf = [0u8; 9];
        f.read_exact_at(&mut buf, 0).unwrap();
        assert_eq!(&buf, b"by handle");
        open_by_handle(&root, &mut dir).expect("a directory's handle");
        assert_eq!(
            errno_of(open_by_handle(&root, &mut gone)),
            Some(libc::ESTALE),
            "a deleted file's handle is stale"
        );
        drop((f, root));
        umount(&s);
    });
}

#[test]
fn stat_and_mount_options_show_what_ext4_shows() {
    on_each_transport(|| {
        let s = Scratch::new("small");
        mount(&s, "");
        assert_eq!(
            fs::metadata(s.mnt()).unwrap().ino(),
            2,
            "the root is inode 2"
        );
        umount(&s);
        if !Path::new("/usr/sbin/mount.fuse.jext").exists() {
            eprintln!(
                "SKIPPED part: mount -t fuse.jext needs /usr/sbin/mount.fuse.jext (scripts/setup)"
            );
            return;
        }
        ok(
            "mount",
            &[
                "-t",
                "fuse.jext",
                "-o",
                "dev,suid",
                p(&s.image()),
                p(&s.mnt()),
            ],
        );
        let line = mount_line(&s.mnt());
        assert!(
            !line.contains("nosuid") && !line.contains("nodev"),
            "dev and suid reach the mount: {line}"
        );
        umount(&s);
        ok(
            "mount",
            &[
                "-t",
                "fuse.jext",
                "-o",
                "nosuid,noexec",
                p(&s.image()),
                p(&s.mnt()),
            ],
        );
        let line = mount_line(&s.mnt());
        assert!(line.contains("nosuid") && line.contains("noexec"), "{line}");
        umount(&s);
    });
}

/// With the writeback cache the kernel keeps a file's times itself; what `stat` showed
/// before an unmount is what the image holds after it (direct-I/O writes and setxattr
/// included).
#[test]
fn times_stat_shows_are_the_times_that_reach_the_disk() {
    on_each_transport(|| {
        let s = Scratch::new("times");
        mount(&s, "writeback_cache");
        let path = s.mnt().join("f");
        fs::write(&path, vec![1u8; 8192]).unwrap();
        let direct = OpenOptions::new()
            .write(true)
            .custom_flags(libc::O_DIRECT)
            .open(&path)
            .unwrap();
        let mut block = vec![0u8; 8192];
        // O_DIRECT wants an aligned buffer: use the 4096-aligned part of a larger one.
        let at = block.as_ptr().align_offset(4096);
        block.resize(at + 4096 + 4096, 2);
        direct.write_all_at(&block[at..at + 4096], 4096).unwrap();
        drop(direct);
        ok("setfattr", &["-n", "user.k", "-v", "v", p(&path)]);
        let times = |m: fs::Metadata| (m.mtime(), m.mtime_nsec(), m.ctime(), m.ctime_nsec());
        let shown = times(fs::metadata(&path).unwrap());
        umount(&s);
        mount(&s, "writeback_cache");
        assert_eq!(
            times(fs::metadata(&path).unwrap()),
            shown,
            "mtime/ctime changed across an unmount"
        );
        umount(&s);
    });
}

/// `jext umount` of a foreground daemon its parent has not reaped: the zombie counts as
/// gone, so the command returns as soon as the mount is (it used to wait 120 s and fail).
#[test]
fn a_zombie_daemon_counts_as_gone() {
    on_each_transport(|| {
        let s = Scratch::new("zombie");
        let daemon = foreground_daemon(&s, "");
        let started = Instant::now();
        jext(&["umount", p(&s.mnt())]);
        assert!(
            started.elapsed() < Duration::from_secs(60),
            "jext umount waited for a zombie"
        );
        let mut daemon = daemon;
        assert!(daemon.wait().unwrap().success());
        e2fsck_clean(&s.image());
    });
}

/// A file capability as `setcap cap_net_raw+ep` writes it (VFS_CAP_REVISION_2, effective;
/// permitted bit 13).
const FILE_CAPABILITY: &str = "0x0100000200200000000000000000000000000000";

/// The permission bits of `path` and whether it carries a file capability.
fn privileges(path: &Path) -> (u32, bool) {
    let mode = fs::metadata(path).unwrap().mode() & 0o7777;
    let caps = sh("getfattr", &["-n", "security.capability", p(path)]);
    (mode, caps.status.success())
}

/// Gives `path` setuid, setgid, every permission and a file capability again.
fn arm(path: &Path) {
    ok(
        "setfattr",
        &["-n", "security.capability", "-v", FILE_CAPABILITY, p(path)],
    );
    fs::set_permissions(path, std::os::unix::fs::PermissionsExt::from_mode(0o6777)).unwrap();
    assert_eq!(privileges(path), (0o6777, true));
}

/// jext drops privileges itself (FUSE_HANDLE_KILLPRIV_V2): the rules ext4 follows, seen
/// through the mount right after each change (the kernel's cached mode must not hide it).
#[test]
fn writes_truncates_and_chowns_drop_setuid_setgid_and_capabilities() {
    on_each_transport(|| {
        let s = Scratch::new("killpriv");
        mount(&s, "allow_other");
        let tool = s.mnt().join("tool");
        fs::write(&tool, b"#!/bin/sh\n").unwrap();
        let append = format!("printf x >> {}", p(&tool));

        arm(&tool);
        assert!(
            as_user_1000(&["sh", "-c", &append]),
            "1000 may write 0o6777"
        );
        assert_eq!(
            privileges(&tool),
            (0o777, false),
            "a user's write drops all"
        );

        arm(&tool);
        assert!(as_user_1000(&["truncate", "-s", "1", p(&tool)]));
        assert_eq!(
            privileges(&tool),
            (0o777, false),
            "a user's truncate drops all"
        );

        // Setgid without group execute stays for a writer in the file's group, and only there
        // (`setattr_should_drop_sgid`).
        let plain_setgid = std::os::unix::fs::PermissionsExt::from_mode(0o2767);
        fs::set_permissions(&tool, plain_setgid).unwrap();
        assert!(as_user_1000(&["sh", "-c", &append]));
        assert_eq!(privileges(&tool).0, 0o767, "1000 is not in group root");
        ok("chgrp", &["1000", p(&tool)]);
        let plain_setgid = std::os::unix::fs::PermissionsExt::from_mode(0o2767);
        fs::set_permissions(&tool, plain_setgid).unwrap();
        assert!(as_user_1000(&["sh", "-c", &append]));
        assert_eq!(privileges(&tool).0, 0o2767, "1000 is in group 1000");
        ok("chgrp", &["0", p(&tool)]);

        // Root has CAP_FSETID: its write keeps the ids but not the capability.
        arm(&tool);
        fs::OpenOptions::new()
            .append(true)
            .open(&tool)
            .unwrap()
            .write_all_at(b"y", 0)
            .unwrap();
        assert_eq!(
            privileges(&tool),
            (0o6777, false),
            "root's write drops the capability"
        );

        // A chown drops them whoever makes it.
        arm(&tool);
        ok("chown", &["1000", p(&tool)]);
        assert_eq!(privileges(&tool), (0o777, false), "chown drops all");

        // A directory's setgid is inheritance, never dropped.
        let dir = s.mnt().join("shared");
        fs::create_dir(&dir).unwrap();
        fs::set_permissions(&dir, std::os::unix::fs::PermissionsExt::from_mode(0o2775)).unwrap();
        ok("chown", &["1000", p(&dir)]);
        assert_eq!(fs::metadata(&dir).unwrap().mode() & 0o7777, 0o2775);
        umount(&s);
        e2fsck_clean(&s.image());
    });
}

/// `include/jext.h` from C: fbarrier and fdatabarrier reach the daemon through the mount
/// and succeed there; elsewhere the ioctl fails, so a program can fall back to fsync.
#[test]
fn fbarrier_and_fdatabarrier_from_c() {
    on_each_transport(|| {
        let s = Scratch::new("fbarrier");
        let program = s.dir.join("barrier.c");
        fs::write(
            &program,
            r#"#include "jext.h"
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <unistd.h>
int main(int argc, char **argv) {
    int fd = open(argv[1], O_CREAT | O_WRONLY | O_TRUNC, 0644);
    if (fd < 0 || write(fd, "first,", 6) != 6) return 10;
    if (jext_fbarrier(fd) != 0) { perror("fbarrier"); return 11; }
    if (write(fd, "second", 6) != 6) return 12;
    if (jext_fdatabarrier(fd) != 0) { perror("fdatabarrier"); return 13; }
    close(fd);
    int other = open(argv[2], O_CREAT | O_WRONLY, 0644);
    if (other < 0) return 14;
    if (jext_fbarrier(other) == 0) return 15;
    printf("%d\n", errno);
    return 0;
}
"#,
        )
        .unwrap();
        let include = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../include");
        let binary = s.dir.join("barrier");
        ok(
            "gcc",
            &[
                "-Wall",
                "-Werror",
                "-I",
                p(&include),
                "-o",
                p(&binary),
                p(&program),
            ],
        );
        mount(&s, "");
        let on_jext = s.mnt().join("ordered");
        let elsewhere = s.dir.join("not-jext");
        let errno_elsewhere = ok(p(&binary), &[p(&on_jext), p(&elsewhere)]);
        assert!(
            !errno_elsewhere.trim().is_empty(),
            "the ioctl failed off jext"
        );
        assert_eq!(fs::read(&on_jext).unwrap(), b"first,second");
        umount(&s);
        e2fsck_clean(&s.image());
    });
}

/// A directory renamed over or removed while open stays until its last close, as an open
/// file does (fstests generic/035): `fstat` on it shows no links, never EIO, and the
/// image is clean once it is closed.
#[test]
fn an_open_directory_outlives_its_name() {
    on_each_transport(|| {
        let s = Scratch::new("open-dir");
        mount(&s, "");
        let (old, new) = (s.mnt().join("old"), s.mnt().join("new"));
        fs::create_dir(&old).unwrap();
        fs::create_dir(&new).unwrap();
        let replaced = fs::File::open(&new).unwrap();
        fs::rename(&old, &new).unwrap();
        assert_eq!(replaced.metadata().unwrap().nlink(), 0, "renamed over");
        let removed = fs::File::open(&new).unwrap();
        fs::remove_dir(&new).unwrap();
        assert_eq!(removed.metadata().unwrap().nlink(), 0, "removed");
        drop((replaced, removed));
        umount(&s);
        e2fsck_clean(&s.image());
    });
}
