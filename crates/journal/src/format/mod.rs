//! JBD2 on-disk structures (in progress).
