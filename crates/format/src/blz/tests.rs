//! Unit tests of the .blz header: digests, paths, lengths.
use super::*;

fn empty_header() -> Header {
    Header {
        data_length: 0,
        data_sha256: "0".repeat(64),
        files: vec![],
        blobs: vec![],
        header_xxh3: Digest(0),
    }
}

fn archive(h: &Header, data: &[u8]) -> Vec<u8> {
    let json = render_header(h);
    let mut v = render_prelude(json.len() as u64).to_vec();
    v.extend_from_slice(&json);
    v.extend_from_slice(data);
    v
}

#[test]
fn header_digest_round_trips_and_detects_flips() {
    let mut h = empty_header();
    h.files.push(FileEntry {
        path: "a/b.txt".into(),
        size: 2,
        content: Content::Plain {
            xxh3: Digest(xxh3_64(b"hi")),
            stored: Stored::Text("hi".into()),
        },
    });
    let json = render_header(&h);
    check_header_digest(&json).unwrap();
    let p = parse(&archive(&h, &[])).unwrap();
    assert_eq!(p.header.files[0].path, "a/b.txt");
    for i in 0..json.len() {
        let mut j = json.clone();
        j[i] ^= 0x20;
        assert!(check_header_digest(&j).is_err(), "flip at {i} undetected");
    }
}

#[test]
fn paths() {
    for ok in ["a", "a/b", "a.b/c..d", ".hidden", "x/.y"] {
        check_path(ok).unwrap();
    }
    for bad in ["", "/a", "a//b", "a/", "../a", "a/../b", "a/.", ".", "a\0b"] {
        assert!(check_path(bad).is_err(), "{bad:?} accepted");
    }
}

#[test]
fn base64_len() {
    assert_eq!(base64_decoded_len(""), Some(0));
    assert_eq!(base64_decoded_len("aGk="), Some(2));
    assert_eq!(base64_decoded_len("aGVsbG8h"), Some(6));
    assert_eq!(base64_decoded_len("aGk"), None);
    assert_eq!(base64_decoded_len("a==="), None);
}

#[test]
fn version_and_lengths() {
    let mut v = archive(&empty_header(), &[]);
    v[8] = 2;
    let e = parse(&v).unwrap_err().to_string();
    assert!(e.contains("version 2") && e.contains("version 1"), "{e}");
    let mut v = archive(&empty_header(), &[]);
    v[12..20].copy_from_slice(&u64::MAX.to_le_bytes());
    assert!(matches!(parse(&v), Err(BlzError::HeaderTooLarge { .. })));
    let mut v = archive(&empty_header(), &[]);
    v[12..20].copy_from_slice(&(1u64 << 29).to_le_bytes());
    assert!(matches!(parse(&v), Err(BlzError::HeaderPastEnd { .. })));
    assert!(matches!(parse(b"CKPTBLZ"), Err(BlzError::TooShort(7))));
    assert!(matches!(parse(&[0u8; 32]), Err(BlzError::BadMagic(_))));
}
