//! Unit tests of `format::delta`: the trailer's round trips, damage and
//! hostile counts, and the records' round trip.

use super::*;
use crate::ckx::BlockDigest;
use crate::cursor::put_varint;
use crate::digest::xxh3_64;

fn trailer(records_digest: Option<u64>) -> Trailer {
    let copy = |n: u64| UnitEntry {
        record_offset: 0,
        record_len: 0,
        record_digest: 0,
        frame_digest: 0,
        meta_digest: 0,
        blocks: (0..n.div_ceil(COPY_BLOCK).max(1))
            .map(|k| BlockDigest {
                end: ((k + 1) * COPY_BLOCK).min(n),
                payload: 0,
                data: 100 + k,
            })
            .collect(),
    };
    let frame = UnitEntry {
        record_offset: 0,
        record_len: 0,
        record_digest: if records_digest.is_some() { 0 } else { 7 },
        frame_digest: 8,
        meta_digest: 9,
        blocks: vec![
            BlockDigest {
                end: 10,
                payload: 11,
                data: 12,
            },
            // Ends that go back still read back as they were.
            BlockDigest {
                end: 3,
                payload: 0,
                data: 0,
            },
        ],
    };
    let mut units = vec![
        copy(0),
        frame.clone(),
        copy(3 * COPY_BLOCK + 5),
        copy(2 * COPY_BLOCK),
    ];
    // A COPY-like unit off the 1 MiB grid keeps its ends.
    let mut off_grid = copy(2 * COPY_BLOCK);
    off_grid.blocks[0].end -= 1;
    units.push(off_grid);
    let mut at = 40;
    for (i, u) in units.iter_mut().enumerate() {
        u.record_offset = at;
        u.record_len = 30 + i as u64 * 1000;
        at += u.record_len;
    }
    // Offsets that do not follow, and the largest length.
    units.push(UnitEntry {
        record_offset: 5,
        record_len: u64::MAX,
        ..frame
    });
    Trailer {
        flags: 0,
        depth: 2,
        z4dm_len: 0,
        head_digest: 1,
        base_len: 2,
        base_digest: 3,
        base_fingerprint: 4,
        base_path: "../a/b.zstn".into(),
        records_digest,
        units,
    }
}

#[test]
fn trailer_round_trips_and_detects_damage() {
    for t in [trailer(None), trailer(Some(77))] {
        let b = t.render();
        let version = u16::from_le_bytes([b[4], b[5]]);
        assert_eq!(version, if t.records_digest.is_some() { 2 } else { 1 });
        assert_eq!(Trailer::find(&b).unwrap(), Some(t));
        for i in 0..b.len() - 4 {
            let mut d = b.clone();
            d[i] ^= 1;
            assert!(Trailer::find(&d).is_err(), "flip at {i} accepted");
        }
    }
    assert_eq!(Trailer::find(b"Z4DM").unwrap(), None);
}

#[test]
fn version_2_is_smaller() {
    let (v1, v2) = (trailer(None).render(), trailer(Some(77)).render());
    // Per COPY block 8 bytes instead of 24; per unit no offset or
    // per-record digest (here 362 bytes against 665).
    assert!(
        v2.len() * 10 < v1.len() * 6,
        "{} against {}",
        v2.len(),
        v1.len()
    );
}

#[test]
fn hostile_counts_are_refused_without_allocating() {
    let mut t = trailer(Some(1));
    t.units.truncate(1);
    let b = t.render();
    // The unit count sits after the fixed fields, the path and the
    // records digest; make it claim 2^62 units.
    let at = 4 + 2 + 2 + 4 + 5 * 8 + 2 + t.base_path.len() + 8;
    let mut d = b[..at].to_vec();
    put_varint(&mut d, 1 << 62);
    d.extend_from_slice(&b[at + 1..b.len() - 20]);
    let e = Trailer::find(&reframe(&d)).unwrap_err();
    assert!(e.contains("do not fit"), "{e}");
}

/// Re-frames `inner` (a trailer from "CKD1" up to its body digest) with
/// a valid body digest and length, so a parse gets past the checksum.
fn reframe(inner: &[u8]) -> Vec<u8> {
    let mut d = inner.to_vec();
    let body = xxh3_64(&d);
    d.extend_from_slice(&body.to_le_bytes());
    d.extend_from_slice(&(d.len() as u64 + 12).to_le_bytes());
    d.extend_from_slice(TRAILER_MAGIC);
    d
}

proptest::proptest! {
    /// Any bytes behind a valid checksum: a trailer or an error, never
    /// a panic or an allocation beyond the input.
    #[test]
    fn damaged_fields_behind_a_valid_checksum_never_panic(
        edits in proptest::collection::vec((0usize..4096, proptest::num::u8::ANY), 1..8),
        cut in 0usize..64,
        v2 in proptest::bool::ANY,
    ) {
        let b = trailer(v2.then_some(5)).render();
        let mut inner = b[..b.len() - 20].to_vec();
        for (at, x) in edits {
            let n = inner.len();
            inner[at % n] = x;
        }
        inner.truncate(inner.len() - cut.min(inner.len() - 1));
        let _ = Trailer::find(&reframe(&inner));
    }
}

#[test]
fn records_round_trip() {
    let mut f = render_head(b"{}", 10, [7; 8], 3);
    let start = f.len();
    let mut ends = vec![];
    for (k, n) in [
        (DeltaKind::Copy, 0),
        (DeltaKind::Full, 3),
        (DeltaKind::Delta, 4),
    ] {
        let r = Some((4u64, [9u8; 16])).filter(|_| k == DeltaKind::Delta);
        f.extend(render_record_head("t", 0, 4, k, n, r));
        f.extend(std::iter::repeat_n(0xAA, n as usize));
        ends.push(f.len());
    }
    let h = parse_head(&f).unwrap();
    assert_eq!((h.records_start, h.data_len, h.n_records), (start, 10, 3));
    let mut at = start;
    for (i, k) in [DeltaKind::Copy, DeltaKind::Full, DeltaKind::Delta]
        .into_iter()
        .enumerate()
    {
        let r = parse_record(&f, at).unwrap();
        assert_eq!(r.kind, k);
        assert_eq!(r.end_offset, ends[i]);
        assert!(f[r.frame.clone()].iter().all(|&b| b == 0xAA));
        at = r.end_offset;
    }
    assert!(parse_record(&f, f.len() - 3).is_err());
}

#[test]
fn base_paths() {
    assert!(check_base_path("../step-900/model.zstn").is_ok());
    for bad in ["", "/abs", "a//b", "./a", "a\0b"] {
        assert!(check_base_path(bad).is_err(), "{bad:?}");
    }
}
