//! The thread engine: a pool of threads, one per queue slot, each running the device's
//! synchronous methods. It works on any device (the fallback where io_uring is not
//! allowed), at the price of a thread hand-off per command.
//!
//! Promises: every dispatched command runs once and is reported once; dropping the engine
//! waits for every command it was given (from one of its own threads, it lets that thread
//! finish by itself). It does not keep dispatch order (threads race to
//! the device), so the IO layer never relies on a barrier write through it.

use crate::engine::{join_unless_current, run, Engine, EngineKind, Sink};
use jext_device::{BlockDevice, Command};
use parking_lot::{Condvar, Mutex};
use std::collections::VecDeque;
use std::sync::Arc;
use std::thread::JoinHandle;

pub(crate) struct ThreadEngine {
    shared: Arc<Shared>,
    threads: Vec<JoinHandle<()>>,
}

struct Shared {
    device: Arc<dyn BlockDevice>,
    sink: Sink,
    queue: Mutex<Queue>,
    work: Condvar,
}

struct Queue {
    commands: VecDeque<(u64, Command)>,
    shutting_down: bool,
}

impl ThreadEngine {
    pub(crate) fn start(device: Arc<dyn BlockDevice>, depth: usize, sink: Sink) -> ThreadEngine {
        let shared = Arc::new(Shared {
            device,
            sink,
            queue: Mutex::new(Queue {
                commands: VecDeque::new(),
                shutting_down: false,
            }),
            work: Condvar::new(),
        });
        let threads = (0..depth.max(1))
            .map(|i| {
                let shared = shared.clone();
                std::thread::Builder::new()
                    .name(format!("jext-io-{i}"))
                    .spawn(move || shared.work())
                    .expect("cannot start an IO thread")
            })
            .collect();
        ThreadEngine { shared, threads }
    }
}

impl Shared {
    fn work(&self) {
        loop {
            let (tag, command) = {
                let mut q = self.queue.lock();
                loop {
                    if let Some(next) = q.commands.pop_front() {
                        break next;
                    }
                    if q.shutting_down {
                        return;
                    }
                    self.work.wait(&mut q);
                }
            };
            self.sink.complete(tag, run(self.device.as_ref(), &command));
        }
    }
}

impl Engine for ThreadEngine {
    fn dispatch(&self, tag: u64, command: Command) {
        self.shared.queue.lock().commands.push_back((tag, command));
        self.shared.work.notify_one();
    }

    fn keeps_dispatch_order(&self) -> bool {
        false
    }

    fn depth(&self) -> usize {
        self.threads.len()
    }

    fn name(&self) -> &'static str {
        EngineKind::Threads.name()
    }
}

impl Drop for ThreadEngine {
    fn drop(&mut self) {
        self.shared.queue.lock().shutting_down = true;
        self.shared.work.notify_all();
        for thread in self.threads.drain(..) {
            join_unless_current(thread);
        }
    }
}
