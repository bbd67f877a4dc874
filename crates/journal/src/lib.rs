//! The journal layer: JBD2.

pub mod area;
pub mod format;

pub use area::{AreaRun, JournalArea};
