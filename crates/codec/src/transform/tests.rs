use super::*;
use proptest::prelude::*;

proptest! {
    #[test]
    fn byteplane_roundtrip(w in prop::sample::select(vec![1usize, 2, 4, 8]), n in prop_oneof![0usize..300, 0usize..3000], seed in any::<u64>()) {
        let body: Vec<u8> = (0..n * w).map(|i| (seed.wrapping_mul(i as u64 + 1) >> 13) as u8).collect();
        let planes = byteplane_split(&body, w);
        // The writer's split (vectorised for w = 2) gives the same planes.
        let mut into: Vec<Vec<u8>> = (0..w).map(|_| vec![0xA5; n]).collect();
        let mut refs: Vec<&mut [u8]> = into.iter_mut().map(|p| p.as_mut_slice()).collect();
        byteplane_split_into(&body, &mut refs);
        prop_assert_eq!(&into, &planes);
        let refs: Vec<&[u8]> = planes.iter().map(|p| p.as_slice()).collect();
        let mut out = vec![0u8; body.len()];
        byteplane_join(&refs, &mut out).unwrap();
        prop_assert_eq!(out, body);
    }

    #[test]
    fn bitfield_roundtrip(which in 0usize..3, n in 0usize..300, seed in any::<u64>(), start in 0usize..40) {
        let spec = [BFLOAT16, FLOAT16, FLOAT32][which];
        let eb = spec.elem_bytes();
        let body: Vec<u8> = (0..n * eb).map(|i| (seed.wrapping_mul(i as u64 * 2 + 1) >> 17) as u8).collect();
        let planes = bitfield_split(spec, &body);
        let lens = spec.plane_lens(n);
        for (p, l) in planes.iter().zip(&lens) { prop_assert_eq!(p.len(), *l); }
        let mants: Vec<&[u8]> = if n == 0 { vec![&[][..]; spec.mant_planes()] } else { planes[2].chunks(n).collect() };
        let mut out = vec![0u8; body.len()];
        bitfield_join(spec, &planes[0], 0, &planes[1], &mants, &mut out).unwrap();
        prop_assert_eq!(&out, &body);
        // A sub-range rebuilt from partial planes.
        let a = start.min(n);
        let b = n;
        let mants: Vec<&[u8]> = (0..spec.mant_planes()).map(|k| &planes[2][k * n + a..k * n + b]).collect();
        let mut part = vec![0u8; (b - a) * eb];
        bitfield_join(spec, &planes[0][a / 8..], a % 8, &planes[1][a..b], &mants, &mut part).unwrap();
        prop_assert_eq!(&part[..], &body[a * eb..b * eb]);
    }
}

proptest! {
    #[test]
    fn split_into_matches_bitfield_split(f32 in any::<bool>(), n in prop_oneof![0usize..80, 0usize..3000], seed in any::<u64>()) {
        let (spec, eb) = if f32 { (FLOAT32, 4) } else { (BFLOAT16, 2) };
        let mut x = seed | 1;
        let body: Vec<u8> = (0..n * eb).map(|_| { x ^= x << 13; x ^= x >> 7; x ^= x << 17; x as u8 }).collect();
        let want = bitfield_split(spec, &body);
        // Dirty planes: every byte must be written.
        let mut sign = vec![0xA5u8; n.div_ceil(8)];
        let mut exp = vec![0xA5u8; n];
        let mut mant = vec![0xA5u8; n * spec.mant_planes()];
        if f32 {
            let (m0, rest) = mant.split_at_mut(n);
            let (m1, m2) = rest.split_at_mut(n);
            f32_split_into(&body, &mut sign, &mut exp, [m0, m1, m2]);
        } else {
            bf16_split_into(&body, &mut sign, &mut exp, &mut mant);
        }
        prop_assert_eq!(&sign, &want[0]);
        prop_assert_eq!(&exp, &want[1]);
        prop_assert_eq!(&mant, &want[2]);
    }
}

#[test]
fn bf16_mantissa_bytes_stay_below_0x80() {
    let body: Vec<u8> = (0..=255u8).flat_map(|b| [b, b]).collect();
    let planes = bitfield_split(BFLOAT16, &body);
    assert!(planes[2].iter().all(|&m| m < 0x80));
    assert_eq!(planes.len(), 3);
    assert_eq!(BitfieldSpec::by_name(b"bfloat16"), Some(BFLOAT16));
    assert_eq!(BitfieldSpec::by_name(b"bf16"), None);
}

#[test]
fn masked_bf16_join_matches_the_bit_field_join_at_every_offset() {
    let n = 700;
    let body: Vec<u8> = (0..2 * n)
        .map(|i| {
            (i as u64)
                .wrapping_mul(0x9E37_79B9_7F4A_7C15)
                .rotate_left(29) as u8
        })
        .collect();
    let planes = bitfield_split(BFLOAT16, &body);
    let mut masks = Vec::new();
    for a in 0..20 {
        for b in [a, a + 1, a + 63, a + 64, a + 65, a + 200, n] {
            let b = b.min(n).max(a);
            sign_masks(&planes[0][a / 8..], a % 8, b - a, &mut masks);
            assert_eq!(masks.len(), (b - a).div_ceil(64));
            for i in 0..b - a {
                let bit = a + i;
                let want = (planes[0][bit / 8] >> (7 - bit % 8)) & 1;
                assert_eq!(
                    (masks[i / 64] >> (i % 64)) & 1,
                    u64::from(want),
                    "[{a}, {b}) {i}"
                );
            }
            // Runs of any length from any element of the range.
            for first in [0, 1, 31, 33] {
                if first > b - a {
                    continue;
                }
                let mut out = vec![0u8; 2 * (b - a - first)];
                bf16_join_masked(
                    &masks,
                    first,
                    &planes[1][a + first..b],
                    &planes[2][a + first..b],
                    &mut out,
                );
                assert_eq!(out, body[2 * (a + first)..2 * b], "[{a}, {b}) from {first}");
            }
        }
    }
}

#[test]
fn join_rejects_short_planes() {
    let mut out = vec![0u8; 8];
    assert!(byteplane_join(&[&[0u8; 4], &[0u8; 3]], &mut out).is_err());
    assert!(bitfield_join(BFLOAT16, &[0], 0, &[0; 3], &[&[0; 4]], &mut out).is_err());
}
