//! Progress on a terminal: a spinner with what is being done, or a byte counter with
//! files and throughput for copies. Hidden when stderr is not a terminal, so piped and
//! scripted runs stay quiet.

use indicatif::{ProgressBar, ProgressStyle};
use std::io::IsTerminal;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

pub struct Progress {
    bar: ProgressBar,
    files: AtomicU64,
}

impl Progress {
    /// A spinner that says `what` (e.g. "checking disk.img") and the elapsed time.
    pub fn spinner(what: &str) -> Progress {
        Progress::styled("{spinner} [{elapsed}] {msg}", what)
    }

    /// A counter of files and bytes copied, with throughput.
    pub fn copy(what: &str) -> Progress {
        Progress::styled(
            "{spinner} [{elapsed}] {msg}: {binary_bytes} ({binary_bytes_per_sec})",
            what,
        )
    }

    /// A bar of `total` steps with the elapsed time, an estimate of what is left, and
    /// `what` (the step under way).
    pub fn steps(total: u64, what: &str) -> Progress {
        let progress = Progress::styled(
            "{spinner} [{elapsed}] [{bar:30}] {pos}/{len}, ~{eta} left: {wide_msg}",
            what,
        );
        progress.bar.set_length(total);
        progress
    }

    fn styled(template: &str, what: &str) -> Progress {
        let bar = if std::io::stderr().is_terminal() {
            let bar = ProgressBar::new_spinner();
            bar.set_style(ProgressStyle::with_template(template).expect("a valid template"));
            bar.enable_steady_tick(Duration::from_millis(200));
            bar
        } else {
            ProgressBar::hidden()
        };
        bar.set_message(what.to_string());
        Progress {
            bar,
            files: AtomicU64::new(0),
        }
    }

    /// Replaces the message (for running counts).
    pub fn say(&self, message: String) {
        self.bar.set_message(message);
    }

    /// Prints a line above the bar (or alone, when there is no terminal to draw on).
    pub fn line(&self, text: &str) {
        if self.bar.is_hidden() {
            eprintln!("{text}");
        } else {
            self.bar.println(text);
        }
    }

    /// Moves a bar of steps to `done`.
    pub fn at(&self, done: u64) {
        self.bar.set_position(done);
    }

    /// Counts `bytes` more copied.
    pub fn bytes(&self, bytes: u64) {
        self.bar.inc(bytes);
    }

    /// Counts one more file (or directory, or link) done.
    pub fn file_done(&self, what: &str) {
        let files = self.files.fetch_add(1, Ordering::Relaxed) + 1;
        self.bar.set_message(format!("{what} {files} files"));
    }

    /// Removes the line; what follows prints on a clean terminal.
    pub fn finish(&self) {
        self.bar.finish_and_clear();
    }
}
