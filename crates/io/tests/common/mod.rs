//! A scripted device for the IO layer's tests: it records every command in the order it
//! was dispatched and completes each only when the test says so, in any order the test
//! picks; the bytes land in a simulator underneath, so crash states can be taken too.

use jext_io::jext_device::{
    BlockDevice, Capabilities, Command, CommandDone, CommandQueue, DeviceCounters, DeviceError,
    SimDevice, WriteFlags,
};
use parking_lot::Mutex;
use std::sync::Arc;

/// What the device saw, in order.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Event {
    Dispatched { id: usize, command: Seen },
    Completed { id: usize },
}

/// A command as dispatched.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Seen {
    Write {
        offset: u64,
        len: u64,
        flags: WriteFlags,
    },
    Flush,
}

pub struct Scripted {
    pub sim: SimDevice,
    barrier: bool,
    queue_depth: usize,
    events: Mutex<Vec<Event>>,
    held: Mutex<Vec<(usize, Command, CommandDone)>>,
    next_id: Mutex<usize>,
    /// Writes to these offsets fail when completed.
    failing: Mutex<Vec<u64>>,
}

impl Scripted {
    pub fn new(barrier: bool, queue_depth: usize) -> Arc<Scripted> {
        let sim = SimDevice::new(16 << 20);
        let sim = if barrier {
            sim.with_barrier_write()
        } else {
            sim
        };
        Arc::new(Scripted {
            sim,
            barrier,
            queue_depth,
            events: Mutex::new(Vec::new()),
            held: Mutex::new(Vec::new()),
            next_id: Mutex::new(0),
            failing: Mutex::new(Vec::new()),
        })
    }

    pub fn events(&self) -> Vec<Event> {
        self.events.lock().clone()
    }

    /// Commands dispatched and not yet completed.
    pub fn held(&self) -> usize {
        self.held.lock().len()
    }

    pub fn fail_writes_at(&self, offset: u64) {
        self.failing.lock().push(offset);
    }

    /// Completes the held command at `index` (modulo how many are held); false if none.
    pub fn complete(&self, index: usize) -> bool {
        let (id, command, done) = {
            let mut held = self.held.lock();
            if held.is_empty() {
                return false;
            }
            let at = index % held.len();
            held.remove(at)
        };
        let fails = matches!(&command, Command::Write { offset, .. } if self.failing.lock().contains(offset));
        let result = if fails {
            Err(DeviceError::media(
                jext_io::jext_device::DeviceOp::Write,
                0,
                0,
                "scripted failure",
            ))
        } else {
            match &command {
                Command::Write {
                    offset,
                    data,
                    flags,
                } => self.sim.write(*offset, data, *flags),
                Command::Flush => self.sim.flush(),
            }
        };
        self.events.lock().push(Event::Completed { id });
        done(result);
        true
    }

    /// Completes everything, oldest first, including what completions dispatch.
    pub fn complete_all(&self) {
        while self.complete(0) {}
    }
}

impl BlockDevice for Scripted {
    fn size_bytes(&self) -> u64 {
        self.sim.size_bytes()
    }
    fn sector_size(&self) -> u32 {
        self.sim.sector_size()
    }
    fn read_at(&self, offset: u64, buf: &mut [u8]) -> Result<(), DeviceError> {
        self.sim.read_at(offset, buf)
    }
    fn write(&self, offset: u64, data: &[u8], flags: WriteFlags) -> Result<(), DeviceError> {
        self.sim.write(offset, data, flags)
    }
    fn flush(&self) -> Result<(), DeviceError> {
        self.sim.flush()
    }
    fn capabilities(&self) -> Capabilities {
        Capabilities {
            volatile_cache: true,
            native_fua: true,
            barrier_write: self.barrier,
            queue_depth: Some(self.queue_depth),
        }
    }
    fn command_queue(&self) -> Option<&dyn CommandQueue> {
        Some(self)
    }
    fn counters(&self) -> &DeviceCounters {
        self.sim.counters()
    }
    fn describe(&self) -> String {
        "scripted device".into()
    }
}

impl CommandQueue for Scripted {
    fn dispatch(&self, command: Command, done: CommandDone) {
        let id = {
            let mut next = self.next_id.lock();
            *next += 1;
            *next - 1
        };
        let seen = match &command {
            Command::Write {
                offset,
                data,
                flags,
            } => Seen::Write {
                offset: *offset,
                len: data.len() as u64,
                flags: *flags,
            },
            Command::Flush => Seen::Flush,
        };
        self.events
            .lock()
            .push(Event::Dispatched { id, command: seen });
        self.held.lock().push((id, command, done));
    }

    fn keeps_dispatch_order(&self) -> bool {
        true
    }
}
