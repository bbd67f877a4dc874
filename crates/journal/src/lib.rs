//! The journal layer: JBD2.

pub mod area;
pub mod error;
pub mod format;
pub mod jbuf;
pub mod tid;

pub use area::{AreaRun, JournalArea};
pub use error::JournalError;
pub use jbuf::JBuf;
pub use tid::{tid_geq, tid_gt, Tid};
