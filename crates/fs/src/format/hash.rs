//! Directory name hashes for htree directories: legacy, half-MD4 and TEA, each in a
//! signed and an unsigned variant (whether name bytes are read as `i8` or `u8`; the
//! superblock's `s_flags` says which this file system uses).
//!
//! The result is `(major, minor)`; the major hash has its low bit cleared, because index
//! entries use that bit to mark a hash collision that continues in the next leaf. These
//! functions must agree bit for bit with the kernel's, or lookups land in the wrong leaf.
//!
//! Promise: pure functions of the name, the version and the seed; an unknown version is
//! `None`, never a panic. Nothing here decides which variant a file system uses: the
//! on-disk `hash_version` (0..2) plus 3 when `s_flags` says unsigned.

/// `dx_root_info.hash_version` values (the unsigned variants are base + 3).
pub const HASH_LEGACY: u8 = 0;
pub const HASH_HALF_MD4: u8 = 1;
pub const HASH_TEA: u8 = 2;
pub const HASH_LEGACY_UNSIGNED: u8 = 3;
pub const HASH_HALF_MD4_UNSIGNED: u8 = 4;
pub const HASH_TEA_UNSIGNED: u8 = 5;

/// The largest major hash (the kernel reserves `0x7fffffff << 1` for end of directory).
const HTREE_EOF_32BIT: u32 = 0x7fff_ffff;

const DEFAULT_SEED: [u32; 4] = [0x6745_2301, 0xefcd_ab89, 0x98ba_dcfe, 0x1032_5476];

/// Hashes `name` with algorithm `version` (one of the six constants) and `seed`
/// (`s_hash_seed`; all zeros means the default seed).
pub fn dirhash(name: &[u8], version: u8, seed: [u32; 4]) -> Option<(u32, u32)> {
    let mut buf = if seed.iter().any(|&w| w != 0) {
        seed
    } else {
        DEFAULT_SEED
    };
    let unsigned = version >= 3;
    let (hash, minor) = match version {
        HASH_LEGACY | HASH_LEGACY_UNSIGNED => (dx_hack_hash(name, unsigned), 0),
        HASH_HALF_MD4 | HASH_HALF_MD4_UNSIGNED => {
            for start in (0..name.len()).step_by(32) {
                half_md4_transform(&mut buf, &str2hashbuf::<8>(&name[start..], unsigned));
            }
            (buf[1], buf[2])
        }
        HASH_TEA | HASH_TEA_UNSIGNED => {
            for start in (0..name.len()).step_by(16) {
                tea_transform(&mut buf, &str2hashbuf::<4>(&name[start..], unsigned));
            }
            (buf[0], buf[1])
        }
        _ => return None,
    };
    let mut major = hash & !1;
    if major == HTREE_EOF_32BIT << 1 {
        major = (HTREE_EOF_32BIT - 1) << 1;
    }
    Some((major, minor))
}

fn byte_value(b: u8, unsigned: bool) -> u32 {
    if unsigned {
        u32::from(b)
    } else {
        b as i8 as i32 as u32
    }
}

fn dx_hack_hash(name: &[u8], unsigned: bool) -> u32 {
    let (mut hash0, mut hash1) = (0x12a3_fe2du32, 0x37ab_e8f9u32);
    for &b in name {
        let mut hash = hash1.wrapping_add(hash0 ^ byte_value(b, unsigned).wrapping_mul(7_152_373));
        if hash & 0x8000_0000 != 0 {
            hash = hash.wrapping_sub(0x7fff_ffff);
        }
        hash1 = hash0;
        hash0 = hash;
    }
    hash0 << 1
}

/// Packs the next `N * 4` bytes of `rest` (the name from the current chunk on) into
/// words, earlier bytes in the higher bits, padding with a word made of the length of
/// `rest`: the kernel pads with the *remaining* length, not the chunk's, so the padding
/// of every chunk depends on how much of the name is left.
fn str2hashbuf<const N: usize>(rest: &[u8], unsigned: bool) -> [u32; N] {
    let remaining = rest.len() as u32;
    let mut pad = remaining | (remaining << 8);
    pad |= pad << 16;
    let mut out = [pad; N];
    let mut val = pad;
    let mut word = 0;
    for (i, &b) in rest.iter().take(N * 4).enumerate() {
        val = byte_value(b, unsigned).wrapping_add(val << 8);
        if i % 4 == 3 {
            out[word] = val;
            word += 1;
            val = pad;
        }
    }
    if word < N {
        out[word] = val;
    }
    out
}

fn tea_transform(buf: &mut [u32; 4], input: &[u32; 4]) {
    const DELTA: u32 = 0x9E37_79B9;
    let (mut sum, mut b0, mut b1) = (0u32, buf[0], buf[1]);
    let [a, b, c, d] = *input;
    for _ in 0..16 {
        sum = sum.wrapping_add(DELTA);
        b0 = b0.wrapping_add(
            (b1 << 4).wrapping_add(a) ^ b1.wrapping_add(sum) ^ (b1 >> 5).wrapping_add(b),
        );
        b1 = b1.wrapping_add(
            (b0 << 4).wrapping_add(c) ^ b0.wrapping_add(sum) ^ (b0 >> 5).wrapping_add(d),
        );
    }
    buf[0] = buf[0].wrapping_add(b0);
    buf[1] = buf[1].wrapping_add(b1);
}

fn half_md4_transform(buf: &mut [u32; 4], x: &[u32; 8]) {
    const K2: u32 = 0o13240474631;
    const K3: u32 = 0o15666365641;
    let f = |x: u32, y: u32, z: u32| z ^ (x & (y ^ z));
    let g = |x: u32, y: u32, z: u32| (x & y).wrapping_add((x ^ y) & z);
    let h = |x: u32, y: u32, z: u32| x ^ y ^ z;
    let [mut a, mut b, mut c, mut d] = *buf;
    macro_rules! round {
        ($fun:expr, $a:ident, $b:ident, $c:ident, $d:ident, $x:expr, $s:expr) => {
            $a = $a
                .wrapping_add($fun($b, $c, $d))
                .wrapping_add($x)
                .rotate_left($s);
        };
    }
    round!(f, a, b, c, d, x[0], 3);
    round!(f, d, a, b, c, x[1], 7);
    round!(f, c, d, a, b, x[2], 11);
    round!(f, b, c, d, a, x[3], 19);
    round!(f, a, b, c, d, x[4], 3);
    round!(f, d, a, b, c, x[5], 7);
    round!(f, c, d, a, b, x[6], 11);
    round!(f, b, c, d, a, x[7], 19);
    round!(g, a, b, c, d, x[1].wrapping_add(K2), 3);
    round!(g, d, a, b, c, x[3].wrapping_add(K2), 5);
    round!(g, c, d, a, b, x[5].wrapping_add(K2), 9);
    round!(g, b, c, d, a, x[7].wrapping_add(K2), 13);
    round!(g, a, b, c, d, x[0].wrapping_add(K2), 3);
    round!(g, d, a, b, c, x[2].wrapping_add(K2), 5);
    round!(g, c, d, a, b, x[4].wrapping_add(K2), 9);
    round!(g, b, c, d, a, x[6].wrapping_add(K2), 13);
    round!(h, a, b, c, d, x[3].wrapping_add(K3), 3);
    round!(h, d, a, b, c, x[7].wrapping_add(K3), 9);
    round!(h, c, d, a, b, x[2].wrapping_add(K3), 11);
    round!(h, b, c, d, a, x[6].wrapping_add(K3), 15);
    round!(h, a, b, c, d, x[1].wrapping_add(K3), 3);
    round!(h, d, a, b, c, x[5].wrapping_add(K3), 9);
    round!(h, c, d, a, b, x[0].wrapping_add(K3), 11);
    round!(h, b, c, d, a, x[4].wrapping_add(K3), 15);
    buf[0] = buf[0].wrapping_add(a);
    buf[1] = buf[1].wrapping_add(b);
    buf[2] = buf[2].wrapping_add(c);
    buf[3] = buf[3].wrapping_add(d);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn major_hash_has_its_low_bit_clear() {
        for version in 0..6 {
            for name in [
                &b"a"[..],
                b"lost+found",
                b"a-much-longer-name-than-thirty-two-bytes-long",
            ] {
                let (major, _) = dirhash(name, version, [0; 4]).unwrap();
                assert_eq!(major & 1, 0);
            }
        }
        assert!(dirhash(b"x", 9, [0; 4]).is_none());
    }

    /// Known answers from e2fsprogs 1.47 (`debugfs -R "dx_hash -h ALG -s SEED NAME"`), an
    /// implementation written independently of the kernel's; it hashes signed.
    #[test]
    fn matches_e2fsprogs_known_answers() {
        let seed = [0x0403_0201, 0x0807_0605, 0x0c0b_0a09, 0x100f_0e0d];
        let long = "café-a-much-longer-name-than-thirty-two-bytes".as_bytes();
        type Case<'a> = (&'a [u8], u8, [u32; 4], (u32, u32));
        let cases: [Case; 8] = [
            (b"hello", HASH_LEGACY, seed, (0x3225_2546, 0)),
            (long, HASH_LEGACY, seed, (0x1a60_5e22, 0)),
            (b"hello", HASH_HALF_MD4, seed, (0xe2dd_f968, 0xc8bc_0924)),
            (long, HASH_HALF_MD4, seed, (0x3467_52b4, 0x3819_31b2)),
            (b"hello", HASH_HALF_MD4, [0; 4], (0x1746_da32, 0x4200_13b5)),
            (b"hello", HASH_TEA, seed, (0x1a56_92b6, 0x2fd9_857d)),
            (long, HASH_TEA, seed, (0x9404_d5d0, 0xdd8b_254f)),
            (b"hello", HASH_TEA, [0; 4], (0x6f5b_b1a8, 0x2319_17c2)),
        ];
        for (name, version, seed, expected) in cases {
            assert_eq!(
                dirhash(name, version, seed),
                Some(expected),
                "{} with version {version}",
                String::from_utf8_lossy(name)
            );
        }
    }

    #[test]
    fn signed_and_unsigned_differ_only_for_high_bytes() {
        let ascii = dirhash(b"plain", HASH_HALF_MD4, [1, 2, 3, 4]);
        assert_eq!(
            ascii,
            dirhash(b"plain", HASH_HALF_MD4_UNSIGNED, [1, 2, 3, 4])
        );
        let high = "é".as_bytes();
        assert_ne!(
            dirhash(high, HASH_TEA, [0; 4]),
            dirhash(high, HASH_TEA_UNSIGNED, [0; 4])
        );
    }
}
