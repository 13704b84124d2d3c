use super::*;
use crate::test_support::{z4ai_opaque_frame, zstd_rle_frame, zstn_of_frames, zstn_with_header};
use ckptfs_format::frame::MAX_BLOCK_BYTES;

fn archive(tensors: &[(&str, u64, Vec<u8>)]) -> ZstnArchive {
    ZstnArchive::from_bytes(zstn_of_frames(tensors), Path::new("t.zstn")).unwrap()
}

#[test]
fn a_whole_frame_block_within_the_limit_decodes() {
    let frame = z4ai_opaque_frame(1, 3 << 20, &zstd_rle_frame(3 << 20, 7));
    let a = archive(&[("w", 3 << 20, frame)]);
    assert_eq!(
        a.block_len(BlockKey { unit: 0, block: 0 }).unwrap(),
        3 << 20
    );
    let mut buf = vec![0u8; 100];
    let n = a.read_at(0, a.prefix_len(0) + 12345, &mut buf).unwrap();
    assert_eq!(&buf[..n], &[7u8; 100][..]);
}

#[test]
fn a_block_over_the_limit_is_refused_naming_the_tensor_before_allocating() {
    let big = 2 * MAX_BLOCK_BYTES;
    let bomb = z4ai_opaque_frame(1, big, &zstd_rle_frame(big, 0));
    assert!(bomb.len() < 70_000, "{}", bomb.len());
    let ok = z4ai_opaque_frame(0, 5, b"hello");
    let a = archive(&[("ok", 5, ok), ("bomb", big, bomb)]);
    let e = a.grid(1).unwrap_err().to_string();
    assert!(
        e.contains("t.zstn") && e.contains("\"bomb\"") && e.contains("limit"),
        "{e}"
    );
    assert!(a.block_len(BlockKey { unit: 1, block: 0 }).is_err());
    let mut buf = [0u8; 16];
    let start = a.prefix_len(0) + 5;
    assert!(a.read_at(0, start, &mut buf).is_err());
    // The other tensor still reads.
    let mut five = [0u8; 5];
    a.read_at(0, a.prefix_len(0), &mut five).unwrap();
    assert_eq!(&five, b"hello");
}

/// A z4ai-style file of two stored tensors, `a` (2 bytes) and `b` (3),
/// whose header JSON is `header`.
fn with_header(header: &str) -> ZstnArchive {
    let f = zstn_with_header(
        header,
        &[
            ("a", 2, z4ai_opaque_frame(0, 2, b"ab")),
            ("b", 3, z4ai_opaque_frame(0, 3, b"cde")),
        ],
    );
    ZstnArchive::from_bytes(f, Path::new("h.zstn")).unwrap()
}

#[test]
fn verify_holds_the_header_to_the_index_in_one_walk() {
    let e = |a: ZstnArchive| crate::verify(&a, &|_| {}).map_err(|e| e.to_string());
    let t = |n: &str, b: u64, e: u64| {
        format!(
            "\"{n}\":{{\"dtype\":\"U8\",\"shape\":[{}],\"data_offsets\":[{b},{e}]}}",
            e - b
        )
    };
    let ok = e(with_header(&format!(
        "{{{},{}}}",
        t("b", 2, 5),
        t("a", 0, 2)
    )))
    .unwrap();
    assert!(ok.starts_with("2 tensors"), "{ok}");
    // As in a JSON object, the last entry of a name counts.
    let dup = format!("{{{},{},{}}}", t("a", 9, 11), t("b", 2, 5), t("a", 0, 2));
    e(with_header(&dup)).unwrap();
    let err = e(with_header(&format!(
        "{{{},{}}}",
        t("a", 0, 2),
        t("c", 2, 5)
    )))
    .unwrap_err();
    assert!(err.contains("tensor \"c\" has no index record"), "{err}");
    let err = e(with_header(&format!("{{{}}}", t("a", 0, 2)))).unwrap_err();
    assert!(
        err.contains("header lists 1 tensors, index holds 2 records"),
        "{err}"
    );
    let err = e(with_header(&format!(
        "{{{},{}}}",
        t("a", 0, 2),
        t("b", 1, 5)
    )))
    .unwrap_err();
    assert!(
        err.contains("header span [1, 5) but index span [2, 5)"),
        "{err}"
    );
    // A header that is not JSON has nothing to hold to the index: the
    // file still decodes exactly as stored, and the summary says so.
    let loose = e(with_header("{\"a\":")).unwrap();
    assert!(
        loose.contains("the header is not strict safetensors"),
        "{loose}"
    );
}

#[test]
fn the_prefix_is_the_files_own_bytes() {
    let a = with_header("{}");
    let p = a.prefix(0).unwrap();
    assert_eq!(p.len() as u64, a.prefix_len(0));
    assert_eq!(&p[..8], &(p.len() as u64 - 8).to_le_bytes());
    assert_eq!(&p[8..], a.header_bytes());
    assert_eq!(a.records()[1].name, "b");
    assert_eq!(a.unit_name(1), "b");
}

#[test]
fn sizes_that_do_not_add_up_are_refused_at_open_naming_the_file() {
    use ckptfs_format::zstn::render_head;
    let frame = z4ai_opaque_frame(0, 40, &[7; 40]);
    let mut f = render_head(b"{}      ", u64::MAX, false);
    f.extend_from_slice(&(frame.len() as u64).to_le_bytes());
    f.extend_from_slice(&frame);
    let e = ZstnArchive::from_bytes(f, Path::new("wrap.zstn"))
        .unwrap_err()
        .to_string();
    assert!(e.starts_with("wrap.zstn: sizes do not add up"), "{e}");
}
