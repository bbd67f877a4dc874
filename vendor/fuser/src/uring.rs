//! jext patch: FUSE over io_uring (Linux 6.14+, `fs/fuse/dev_uring.c`).
//!
//! With `Config::uring`, the session asks for `FUSE_OVER_IO_URING` at INIT when the kernel
//! offers it (it does only while root has set `/sys/module/fuse/parameters/enable_uring`),
//! and then serves ordinary requests through io_uring instead of `read`/`writev` on
//! `/dev/fuse`: each serving thread owns an io_uring with 128-byte SQEs and one ring entry
//! (a header buffer and a payload buffer registered with the kernel), and answers a request
//! and asks for the next one with a single `IORING_OP_URING_CMD` (COMMIT_AND_FETCH), one
//! system call per request where `/dev/fuse` takes two. The kernel puts a request on the
//! queue of the CPU its caller runs on and needs an entry on every possible CPU's queue
//! before it uses any. A queue's threads are not pinned to its CPU (libfuse pins them):
//! measured on 2 cores with varmail (fsyncs that keep a thread waiting for a journal
//! commit), pinned threads served 0.62× the operations of `/dev/fuse`, unpinned ones 1.08×;
//! four threads per queue instead of two served 0.79×.
//!
//! What stays on `/dev/fuse`, by the kernel's design: INIT, FORGET and BATCH_FORGET,
//! INTERRUPT, and the notifications the server sends. The session keeps its classic
//! threads for those, and they serve everything if registration fails (the kernel then
//! falls back by itself).
//!
//! The kernel's layouts (`include/uapi/linux/fuse.h`, ABI 7.42), little-endian:
//!
//! ```text
//! fuse_uring_req_header (288 bytes, iov[0] of REGISTER):
//!   0..128   in_out    fuse_in_header (40 bytes) from the kernel; fuse_out_header
//!                      (16 bytes: len u32, error i32, unique u64) back to it
//!   128..256 op_in     the request's fixed per-opcode struct (in_args[0]); its size is
//!                      in_header.len - 40 - payload_sz
//!   256..288 ring_ent_in_out:
//!              256 flags u64 (0)
//!              264 commit_id u64 (the request's unique)
//!              272 payload_sz u32 (bytes of the payload buffer in use, either way)
//!              276 padding u32, 280 reserved u64
//! payload (iov[1]): the request's remaining arguments (names, write data); the reply's
//!   body (all of it after fuse_out_header). At least the connection's max payload:
//!   max(8 KiB, max_write, max_pages × page size).
//! fuse_uring_cmd_req (the first 24 of the SQE's 80 command bytes):
//!   0 flags u64 (0), 8 commit_id u64 (COMMIT_AND_FETCH: the request answered),
//!   16 qid u16 (the queue), 18 padding [u8; 6]
//! SQE: opcode IORING_OP_URING_CMD, fd /dev/fuse, cmd_op 1 REGISTER / 2 COMMIT_AND_FETCH;
//!   REGISTER also carries addr = &[iovec; 2] and len = 2.
//! ```
//!
//! Promises: every request that arrives on a ring entry is answered on it (an answer the
//! file system never gives becomes EIO), through the same `Filesystem` methods and reply
//! types as on `/dev/fuse`; the kernel never sees the buffers of an entry change while it
//! owns them. Must never free a buffer the kernel may still write: an entry's memory is
//! given back only once the kernel has released the entry (ENOTCONN), and leaked otherwise.

use std::io;
use std::io::IoSlice;
use std::os::fd::AsFd;
use std::os::fd::AsRawFd;
use std::sync::Arc;
use std::sync::Condvar;
use std::sync::Mutex;
use std::time::Duration;

use io_uring::IoUring;
use io_uring::cqueue;
use io_uring::opcode;
use io_uring::squeue;
use io_uring::types;
use log::error;

use crate::Filesystem;
use crate::ll::fuse_abi as abi;
use crate::request::RequestWithSender;
use crate::session::SessionEventLoop;

/// How a session talks to the kernel once INIT is done.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Transport {
    /// `read` and `writev` on `/dev/fuse`, as asked.
    DevFuse,
    /// io_uring, with `/dev/fuse` for what the kernel sends only there.
    IoUring,
    /// io_uring was asked for and cannot be had; `/dev/fuse` serves, for this reason.
    DevFuseFallback(String),
}

/// Where the kernel's switch for FUSE over io_uring lives.
pub const ENABLE_URING_PARAMETER: &str = "/sys/module/fuse/parameters/enable_uring";

/// Why FUSE over io_uring cannot be had on new connections, or `None` when the kernel's
/// switch is on. Root switches it on; a mount asking for io_uring never does it itself, as
/// the switch is global (and stays off by default for a reason: the transport is young).
pub fn uring_unavailable() -> Option<String> {
    match std::fs::read_to_string(ENABLE_URING_PARAMETER) {
        Ok(on) if matches!(on.trim(), "Y" | "1") => None,
        Ok(_) => Some(format!(
            "FUSE over io_uring is switched off ({ENABLE_URING_PARAMETER} is N; root can \
             write Y there for new mounts)"
        )),
        Err(_) => Some(format!(
            "this kernel's FUSE has no io_uring transport (no {ENABLE_URING_PARAMETER})"
        )),
    }
}

/// Whether this process can set up the io_urings the queues need (`kernel.io_uring_disabled`
/// or a seccomp filter can forbid it). Asked before INIT agrees on the transport: once it
/// has, the kernel holds every request until each CPU's queue has an entry.
pub(crate) fn rings_refused() -> Option<String> {
    IoUring::<squeue::Entry128, cqueue::Entry>::builder()
        .build(2)
        .err()
        .map(|e| format!("this process cannot set up an io_uring ({e})"))
}

/// Why the kernel did not offer `FUSE_OVER_IO_URING` at INIT.
pub(crate) fn refusal() -> String {
    uring_unavailable().unwrap_or_else(|| {
        "the kernel did not offer FUSE_OVER_IO_URING although enable_uring is on".into()
    })
}

/// The kernel's queue count: one per possible CPU (`num_possible_cpus()`), from a CPU list
/// such as `0-1` or `0,2-5`.
pub(crate) fn possible_cpus() -> io::Result<usize> {
    let text = std::fs::read_to_string("/sys/devices/system/cpu/possible")?;
    count_cpu_list(text.trim()).ok_or_else(|| {
        io::Error::new(
            io::ErrorKind::InvalidData,
            format!("/sys/devices/system/cpu/possible: not a CPU list: {text:?}"),
        )
    })
}

fn count_cpu_list(list: &str) -> Option<usize> {
    let mut count = 0;
    for part in list.split(',') {
        count += match part.split_once('-') {
            Some((first, last)) => {
                let (first, last) = (first.parse::<usize>().ok()?, last.parse::<usize>().ok()?);
                last.checked_sub(first)? + 1
            }
            None => {
                part.parse::<usize>().ok()?;
                1
            }
        };
    }
    Some(count)
}

/// The payload buffer an entry needs: what the kernel's `fuse_uring_create` asks.
pub(crate) fn payload_bytes(max_write: u32, max_pages: u16) -> usize {
    const FUSE_MIN_READ_BUFFER: usize = 8192;
    FUSE_MIN_READ_BUFFER
        .max(max_write as usize)
        .max(usize::from(max_pages) * page_size::get())
}

const FUSE_IO_URING_CMD_REGISTER: u32 = 1;
const FUSE_IO_URING_CMD_COMMIT_AND_FETCH: u32 = 2;
const IN_OUT_BYTES: usize = 128;
const OP_IN_BYTES: usize = 128;
const HEADER_BYTES: usize = IN_OUT_BYTES + OP_IN_BYTES + 32;
const COMMIT_ID_AT: usize = 264;
const PAYLOAD_SZ_AT: usize = 272;
const IN_HEADER_BYTES: usize = size_of::<abi::fuse_in_header>();
const OUT_HEADER_BYTES: usize = size_of::<abi::fuse_out_header>();

/// The command bytes of an SQE for queue `qid`, answering `commit_id` (0 on REGISTER).
fn command(qid: u16, commit_id: u64) -> [u8; 80] {
    let mut cmd = [0u8; 80];
    cmd[8..16].copy_from_slice(&commit_id.to_le_bytes());
    cmd[16..18].copy_from_slice(&qid.to_le_bytes());
    cmd
}

/// The answer to the request on an entry, written by its reply (from any thread) and
/// handed to the kernel by the entry's thread once the request's dispatch is over.
#[derive(Debug, Default)]
pub(crate) struct RingReply {
    answer: Mutex<Option<Vec<u8>>>,
    answered: Condvar,
}

impl RingReply {
    pub(crate) fn send(&self, data: &[IoSlice<'_>]) -> io::Result<()> {
        let mut answer = self.answer.lock().unwrap_or_else(|e| e.into_inner());
        let mut bytes = Vec::with_capacity(data.iter().map(|d| d.len()).sum());
        for piece in data {
            bytes.extend_from_slice(piece);
        }
        *answer = Some(bytes);
        self.answered.notify_all();
        Ok(())
    }

    /// Waits for the answer of the request just dispatched. `reply` is the entry's own
    /// reference: when it is the only one left, nobody can answer any more.
    fn take(reply: &Arc<RingReply>) -> Option<Vec<u8>> {
        let mut answer = reply.answer.lock().unwrap_or_else(|e| e.into_inner());
        loop {
            if let Some(bytes) = answer.take() {
                return Some(bytes);
            }
            if Arc::strong_count(reply) == 1 {
                return None;
            }
            // A reply kept by another thread sends before it goes; the timeout only
            // notices one dropped without a word (which fuser's replies never do).
            answer = reply
                .answered
                .wait_timeout(answer, Duration::from_secs(1))
                .unwrap_or_else(|e| e.into_inner())
                .0;
        }
    }
}

/// One ring entry's memory: the header buffer, and the payload buffer placed right after
/// room for a `fuse_in_header` and the largest op struct, so that a request can be parsed
/// where it lies, the kernel's three pieces put back together by copying only the two
/// headers in front of the payload.
struct EntryMemory {
    header: Vec<u64>,
    /// `[IN_HEADER_BYTES + OP_IN_BYTES bytes of room][payload]`, as u64s for alignment.
    request: Vec<u64>,
    payload_bytes: usize,
}

const ROOM_BYTES: usize = IN_HEADER_BYTES + OP_IN_BYTES;

impl EntryMemory {
    fn new(payload_bytes: usize) -> EntryMemory {
        EntryMemory {
            header: vec![0; HEADER_BYTES / 8],
            request: vec![0; (ROOM_BYTES + payload_bytes).div_ceil(8)],
            payload_bytes,
        }
    }

    fn header(&mut self) -> &mut [u8] {
        // SAFETY: a Vec<u64> of HEADER_BYTES / 8 elements is HEADER_BYTES initialised bytes;
        // u8 has no alignment or validity demands; the borrow of self keeps it unique.
        unsafe { std::slice::from_raw_parts_mut(self.header.as_mut_ptr().cast(), HEADER_BYTES) }
    }

    fn request(&mut self) -> &mut [u8] {
        let len = self.request.len() * 8;
        // SAFETY: as for `header`: len initialised bytes of a Vec<u64>.
        unsafe { std::slice::from_raw_parts_mut(self.request.as_mut_ptr().cast(), len) }
    }

    /// The two buffers REGISTER hands the kernel.
    fn iovecs(&mut self) -> [libc::iovec; 2] {
        let payload_bytes = self.payload_bytes;
        let header = self.header().as_mut_ptr();
        let payload = self.request()[ROOM_BYTES..].as_mut_ptr();
        [
            libc::iovec {
                iov_base: header.cast(),
                iov_len: HEADER_BYTES,
            },
            libc::iovec {
                iov_base: payload.cast(),
                iov_len: payload_bytes,
            },
        ]
    }

    /// Puts the request the kernel delivered together; returns where it lies in
    /// `request()`. `None` for sizes the kernel would never send.
    fn assemble(&mut self) -> Option<std::ops::Range<usize>> {
        let payload_bytes = self.payload_bytes;
        let header = self.header();
        let len = u32::from_le_bytes(header[..4].try_into().ok()?) as usize;
        let payload_sz =
            u32::from_le_bytes(header[PAYLOAD_SZ_AT..PAYLOAD_SZ_AT + 4].try_into().ok()?) as usize;
        let op_bytes = len.checked_sub(IN_HEADER_BYTES + payload_sz)?;
        if op_bytes > OP_IN_BYTES || payload_sz > payload_bytes || op_bytes % 8 != 0 {
            return None;
        }
        let mut in_header = [0u8; IN_HEADER_BYTES];
        in_header.copy_from_slice(&header[..IN_HEADER_BYTES]);
        let mut op = [0u8; OP_IN_BYTES];
        op[..op_bytes].copy_from_slice(&header[IN_OUT_BYTES..IN_OUT_BYTES + op_bytes]);
        let start = ROOM_BYTES - op_bytes - IN_HEADER_BYTES;
        let request = self.request();
        request[start..start + IN_HEADER_BYTES].copy_from_slice(&in_header);
        request[ROOM_BYTES - op_bytes..ROOM_BYTES].copy_from_slice(&op[..op_bytes]);
        Some(start..ROOM_BYTES + payload_sz)
    }

    fn commit_id(&mut self) -> u64 {
        let header = self.header();
        u64::from_le_bytes(
            header[COMMIT_ID_AT..COMMIT_ID_AT + 8]
                .try_into()
                .expect("8 bytes"),
        )
    }

    /// Writes an answer (`fuse_out_header` and body, as a reply produced it) where the
    /// kernel reads it. An answer too large for the payload buffer becomes EIO.
    fn put_answer(&mut self, answer: &[u8], unique: u64) {
        let body = answer.get(OUT_HEADER_BYTES..).unwrap_or_default();
        let (error, body) = match answer.get(4..8) {
            Some(_) if body.len() > self.payload_bytes => {
                error!(
                    "FUSE answer of {} bytes exceeds the ring's payload buffer; answered EIO",
                    body.len()
                );
                (-libc::EIO, &[][..])
            }
            Some(error) => (i32::from_le_bytes(error.try_into().expect("4 bytes")), body),
            None => (-libc::EIO, &[][..]),
        };
        let payload = &mut self.request()[ROOM_BYTES..];
        payload[..body.len()].copy_from_slice(body);
        let header = self.header();
        header[..4].copy_from_slice(&((OUT_HEADER_BYTES + body.len()) as u32).to_le_bytes());
        header[4..8].copy_from_slice(&error.to_le_bytes());
        header[8..16].copy_from_slice(&unique.to_le_bytes());
        header[PAYLOAD_SZ_AT..PAYLOAD_SZ_AT + 4]
            .copy_from_slice(&(body.len() as u32).to_le_bytes());
    }
}

/// An io_uring SQE for `/dev/fuse`.
fn sqe(fuse_fd: i32, cmd_op: u32, qid: u16, commit_id: u64) -> squeue::Entry128 {
    opcode::UringCmd80::new(types::Fd(fuse_fd), cmd_op)
        .cmd(command(qid, commit_id))
        .build()
}

/// REGISTER: the SQE with the entry's two buffers.
fn register_sqe(fuse_fd: i32, qid: u16, iovecs: &[libc::iovec; 2]) -> squeue::Entry128 {
    let mut entry = opcode::UringCmd80::new(types::Fd(fuse_fd), FUSE_IO_URING_CMD_REGISTER)
        .cmd(command(qid, 0))
        .addr(Some(iovecs.as_ptr() as u64))
        .build();
    // The crate's UringCmd80 sets addr but not len, which REGISTER needs to be 2.
    // SAFETY: Entry128 is #[repr(C)] and begins with the kernel's io_uring_sqe, whose `len`
    // is the u32 at byte 24 (include/uapi/linux/io_uring.h); nothing else aliases `entry`.
    unsafe {
        (&raw mut entry)
            .cast::<u8>()
            .add(24)
            .cast::<u32>()
            .write_unaligned(2);
    }
    entry
}

/// Serves queue `qid` on one ring entry until the connection ends.
pub(crate) fn serve_queue<FS: Filesystem>(
    event_loop: &SessionEventLoop<FS>,
    qid: u16,
    payload_bytes: usize,
) -> io::Result<()> {
    let fuse_fd = event_loop.ch.as_fd().as_raw_fd();
    let mut ring: IoUring<squeue::Entry128, cqueue::Entry> = IoUring::builder().build(2)?;
    let mut memory = std::mem::ManuallyDrop::new(EntryMemory::new(payload_bytes));
    let reply = Arc::new(RingReply::default());
    let iovecs = memory.iovecs();
    let mut next = register_sqe(fuse_fd, qid, &iovecs);
    // REGISTER answers only when it fails, or with the entry's first request.
    let mut registered = false;
    loop {
        // SAFETY: the SQE's buffers (the entry's memory, and for REGISTER the iovec array,
        // which the kernel copies at submission) outlive the command: the memory is freed
        // only after the kernel released the entry.
        unsafe { ring.submission().push(&next) }
            .map_err(|_| io::Error::other("FUSE ring: submission queue full"))?;
        let result = loop {
            match ring.submit_and_wait(1) {
                Ok(_) => {}
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) => return Err(e),
            }
            if let Some(cqe) = ring.completion().next() {
                break cqe.result();
            }
        };
        match -result {
            0 => {}
            libc::EINTR | libc::EAGAIN => continue,
            libc::ENOTCONN | libc::ECONNABORTED => {
                // The kernel has released the entry: its memory is ours again.
                // SAFETY: dropped once, and not used after.
                unsafe { std::mem::ManuallyDrop::drop(&mut memory) };
                return Ok(());
            }
            errno if !registered => {
                // The kernel refused the entry and went back to /dev/fuse for the whole
                // connection: said where the daemon's messages go, as a fallback is.
                eprintln!(
                    "FUSE over io_uring: queue {qid} refused ({}); serving through /dev/fuse",
                    io::Error::from_raw_os_error(errno)
                );
                return Ok(());
            }
            errno => {
                let e = io::Error::from_raw_os_error(errno);
                return Err(io::Error::new(
                    e.kind(),
                    format!("FUSE ring queue {qid}: {e}"),
                ));
            }
        }
        registered = true;
        let commit_id = memory.commit_id();
        let answer = match memory.assemble() {
            Some(range) => {
                let request = &memory.request()[range];
                match RequestWithSender::new(event_loop.ch.sender(), request) {
                    Some(req) => {
                        let req = req.answering_on(reply.clone());
                        event_loop.serve(req);
                        RingReply::take(&reply)
                    }
                    None => None,
                }
            }
            None => {
                error!("FUSE ring queue {qid}: a request of impossible size; answered EIO");
                None
            }
        };
        let eio = abi::fuse_out_header {
            len: OUT_HEADER_BYTES as u32,
            error: -libc::EIO,
            unique: commit_id,
        };
        let eio = zerocopy::IntoBytes::as_bytes(&eio).to_vec();
        memory.put_answer(answer.as_deref().unwrap_or(&eio), commit_id);
        next = sqe(fuse_fd, FUSE_IO_URING_CMD_COMMIT_AND_FETCH, qid, commit_id);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cpu_lists_count_as_the_kernel_counts() {
        assert_eq!(count_cpu_list("0"), Some(1));
        assert_eq!(count_cpu_list("0-1"), Some(2));
        assert_eq!(count_cpu_list("0,2-5,7"), Some(6));
        assert_eq!(count_cpu_list("3-1"), None);
        assert_eq!(count_cpu_list("zero"), None);
    }

    #[test]
    fn commands_carry_queue_and_commit_id_where_the_kernel_reads_them() {
        let cmd = command(0x0102, 0x1122_3344_5566_7788);
        assert_eq!(u64::from_le_bytes(cmd[0..8].try_into().unwrap()), 0);
        assert_eq!(
            u64::from_le_bytes(cmd[8..16].try_into().unwrap()),
            0x1122_3344_5566_7788
        );
        assert_eq!(u16::from_le_bytes(cmd[16..18].try_into().unwrap()), 0x0102);
        assert!(cmd[18..].iter().all(|b| *b == 0));
    }

    #[test]
    fn register_sqe_says_two_iovecs() {
        let mut memory = EntryMemory::new(8192);
        let iovecs = memory.iovecs();
        let sqe = register_sqe(7, 1, &iovecs);
        // SAFETY: reading the 128 bytes of a #[repr(C)] Entry128.
        let bytes: [u8; 128] = unsafe { std::mem::transmute(sqe) };
        assert_eq!(bytes[0], 46, "IORING_OP_URING_CMD");
        assert_eq!(i32::from_le_bytes(bytes[4..8].try_into().unwrap()), 7);
        assert_eq!(
            u64::from_le_bytes(bytes[16..24].try_into().unwrap()),
            iovecs.as_ptr() as u64
        );
        assert_eq!(u32::from_le_bytes(bytes[24..28].try_into().unwrap()), 2);
        assert_eq!(
            u32::from_le_bytes(bytes[8..12].try_into().unwrap()),
            FUSE_IO_URING_CMD_REGISTER
        );
        assert_eq!(u16::from_le_bytes(bytes[64..66].try_into().unwrap()), 1);
        assert_eq!(iovecs[0].iov_len, HEADER_BYTES);
        assert_eq!(iovecs[1].iov_len, 8192);
    }

    /// What the kernel writes for a MKDIR (op struct of 8 bytes, name in the payload) is
    /// put back together as `/dev/fuse` would have delivered it, and an answer lands
    /// where the kernel reads it.
    #[test]
    fn requests_are_reassembled_and_answers_placed() {
        let mut memory = EntryMemory::new(8192);
        let name = b"dir\0";
        let op = [0xaau8; 8];
        let len = (IN_HEADER_BYTES + op.len() + name.len()) as u32;
        let header = memory.header();
        header[..4].copy_from_slice(&len.to_le_bytes());
        header[4..8].copy_from_slice(&9u32.to_le_bytes()); // FUSE_MKDIR
        header[8..16].copy_from_slice(&77u64.to_le_bytes());
        header[IN_OUT_BYTES..IN_OUT_BYTES + 8].copy_from_slice(&op);
        header[COMMIT_ID_AT..COMMIT_ID_AT + 8].copy_from_slice(&77u64.to_le_bytes());
        header[PAYLOAD_SZ_AT..PAYLOAD_SZ_AT + 4]
            .copy_from_slice(&(name.len() as u32).to_le_bytes());
        memory.request()[ROOM_BYTES..ROOM_BYTES + name.len()].copy_from_slice(name);
        assert_eq!(memory.commit_id(), 77);
        let range = memory.assemble().unwrap();
        assert_eq!(range.start % 8, 0);
        let request = memory.request()[range].to_vec();
        assert_eq!(request.len(), len as usize);
        assert_eq!(&request[IN_HEADER_BYTES..IN_HEADER_BYTES + 8], &op);
        assert_eq!(&request[IN_HEADER_BYTES + 8..], name);
        let parsed = crate::ll::AnyRequest::try_from(&request[..]).unwrap();
        assert_eq!(parsed.unique().0, 77);

        let mut answer = vec![0u8; OUT_HEADER_BYTES];
        answer[4..8].copy_from_slice(&0i32.to_le_bytes());
        answer.extend_from_slice(&[5u8; 100]);
        memory.put_answer(&answer, 77);
        let header = memory.header();
        assert_eq!(i32::from_le_bytes(header[4..8].try_into().unwrap()), 0);
        assert_eq!(u64::from_le_bytes(header[8..16].try_into().unwrap()), 77);
        assert_eq!(
            u32::from_le_bytes(header[PAYLOAD_SZ_AT..PAYLOAD_SZ_AT + 4].try_into().unwrap()),
            100
        );
        assert_eq!(&memory.request()[ROOM_BYTES..ROOM_BYTES + 100], &[5u8; 100]);

        // An answer larger than the payload buffer becomes EIO with no body.
        let mut huge = vec![0u8; OUT_HEADER_BYTES];
        huge.extend(std::iter::repeat_n(1u8, 8193));
        memory.put_answer(&huge, 78);
        let header = memory.header();
        assert_eq!(
            i32::from_le_bytes(header[4..8].try_into().unwrap()),
            -libc::EIO
        );
        assert_eq!(
            u32::from_le_bytes(header[PAYLOAD_SZ_AT..PAYLOAD_SZ_AT + 4].try_into().unwrap()),
            0
        );
    }

    #[test]
    fn impossible_sizes_are_refused() {
        let mut memory = EntryMemory::new(8192);
        let header = memory.header();
        // len shorter than the header and payload it claims
        header[..4].copy_from_slice(&10u32.to_le_bytes());
        assert!(memory.assemble().is_none());
        let header = memory.header();
        header[..4].copy_from_slice(&((IN_HEADER_BYTES + 200) as u32).to_le_bytes());
        header[PAYLOAD_SZ_AT..PAYLOAD_SZ_AT + 4].copy_from_slice(&0u32.to_le_bytes());
        assert!(memory.assemble().is_none(), "an op struct over 128 bytes");
    }

    #[test]
    fn an_answer_waits_for_a_reply_kept_elsewhere() {
        let reply = Arc::new(RingReply::default());
        let elsewhere = reply.clone();
        let sender = std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(50));
            elsewhere
                .send(&[IoSlice::new(b"abc"), IoSlice::new(b"de")])
                .unwrap();
        });
        assert_eq!(RingReply::take(&reply).as_deref(), Some(&b"abcde"[..]));
        sender.join().unwrap();
        assert_eq!(RingReply::take(&reply), None, "nobody left to answer");
    }
}
