//! Journal errors: each names what is wrong and where (journal block, transaction), so a
//! torn or corrupt journal is reported, never silently skipped.

use crate::tid::Tid;
use jext_device::DeviceError;
use std::fmt;

#[derive(Clone, Debug)]
pub enum JournalError {
    /// The device failed.
    Device(DeviceError),
    /// A journal structure does not decode.
    Corrupt {
        /// "journal superblock", "descriptor block", "revoke block", "commit block", ...
        structure: &'static str,
        /// Journal block number (index into the journal area).
        journal_block: u32,
        problem: String,
    },
    /// A committed transaction holds a block whose checksum does not match: the commit
    /// block promised it whole, so this is corruption, not a torn tail.
    BlockChecksum {
        journal_block: u32,
        tid: Tid,
        fs_block: u64,
        expected: u32,
        found: u32,
    },
    /// The journal uses a feature jext does not implement.
    Unsupported(String),
    /// The journal holds committed transactions; run recovery before loading it.
    NeedsRecovery,
    /// An earlier error stopped the journal; nothing commits any more.
    Aborted(Box<JournalError>),
    /// A handle asked for more credits than a transaction may hold.
    TooManyCredits { asked: u32, max: u32 },
    /// A transaction grew beyond what the log can hold.
    TransactionTooLarge { tid: Tid, log_blocks: u32 },
    /// The journal is shutting down.
    ShutDown,
    /// The commit thread could not start or died.
    Thread(String),
    /// The file system stopped the journal after a failed operation.
    Halted(String),
}

impl fmt::Display for JournalError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            JournalError::Device(e) => write!(f, "{e}"),
            JournalError::Corrupt {
                structure,
                journal_block,
                problem,
            } => write!(
                f,
                "corrupt {structure} at journal block {journal_block}: {problem}"
            ),
            JournalError::BlockChecksum {
                journal_block,
                tid,
                fs_block,
                expected,
                found,
            } => write!(
                f,
                "journal block {journal_block} of committed transaction {tid} (logged fs block \
                 {fs_block}): checksum mismatch, expected {expected:#010x}, found {found:#010x}"
            ),
            JournalError::Unsupported(what) => write!(f, "unsupported journal: {what}"),
            JournalError::NeedsRecovery => {
                write!(
                    f,
                    "the journal holds committed transactions and needs recovery first"
                )
            }
            JournalError::Aborted(cause) => write!(f, "journal aborted after an error: {cause}"),
            JournalError::TooManyCredits { asked, max } => {
                write!(
                    f,
                    "a handle asked for {asked} credits; at most {max} fit a transaction"
                )
            }
            JournalError::TransactionTooLarge { tid, log_blocks } => write!(
                f,
                "transaction {tid} needs {log_blocks} log blocks, more than the journal holds"
            ),
            JournalError::ShutDown => write!(f, "the journal is shut down"),
            JournalError::Thread(what) => write!(f, "journal thread: {what}"),
            JournalError::Halted(why) => write!(f, "stopped by the file system: {why}"),
        }
    }
}

impl std::error::Error for JournalError {}

impl From<DeviceError> for JournalError {
    fn from(e: DeviceError) -> Self {
        JournalError::Device(e)
    }
}
