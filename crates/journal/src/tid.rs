//! Transaction ids: 32-bit sequence numbers that wrap, compared as JBD2 compares them.

/// A JBD2 transaction id (the on-disk "sequence").
pub type Tid = u32;

/// `a` is later than `b`, allowing for wrap-around.
pub fn tid_gt(a: Tid, b: Tid) -> bool {
    (a.wrapping_sub(b) as i32) > 0
}

/// `a` is `b` or later.
pub fn tid_geq(a: Tid, b: Tid) -> bool {
    (a.wrapping_sub(b) as i32) >= 0
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn comparisons_survive_wrap_around() {
        assert!(tid_gt(5, 4));
        assert!(!tid_gt(4, 4));
        assert!(tid_geq(4, 4));
        assert!(tid_gt(2, u32::MAX - 1), "2 comes after a wrap");
        assert!(!tid_gt(u32::MAX - 1, 2));
    }
}
