use super::*;

fn tensor(name: &str, dtype: Dtype, shape: &[u64], off: u64) -> TensorEntry {
    let len = shape
        .iter()
        .try_fold(dtype.size(), |n, &d| n.checked_mul(d))
        .unwrap_or(4);
    TensorEntry {
        name: name.into(),
        dtype,
        shape: shape.to_vec(),
        data_offset: off,
        data_len: len,
        xxh3: u64::MAX - 1,
    }
}

fn header(tensors: Vec<TensorEntry>) -> Header {
    Header {
        version: 1,
        created_at: "0".into(),
        model_config: serde_json::json!({"b": 1, "a": [1.5e-12, {"z": null, "y": true}]}),
        tokenizer: None,
        sidecar_files: vec![],
        tensors,
        data_sha256: String::new(),
        digest_member: None,
    }
}

fn archive(h: &Header, data_len: usize) -> Vec<u8> {
    let j = render_header(h);
    let mut v = render_prelude(j.len() as u64).to_vec();
    v.extend_from_slice(&j);
    v.resize(v.len() + data_len, 7);
    v
}

#[test]
fn the_safetensors_header_has_sorted_keys_header_order_data_and_space_padding() {
    let ts = vec![
        tensor("z", Dtype::Bf16, &[3], 0),
        tensor("a\"é", Dtype::Bool, &[2, 1], 6),
    ];
    let (p, offsets) = render_safetensors_header(&ts);
    assert_eq!(offsets, [0, 6]);
    let n = u64::from_le_bytes(p[..8].try_into().unwrap()) as usize;
    assert_eq!(n % 8, 0);
    assert_eq!(p.len(), 8 + n);
    let text = std::str::from_utf8(&p[8..]).unwrap();
    assert_eq!(
        text.trim_end(),
        r#"{"a\"é":{"data_offsets":[6,8],"dtype":"BOOL","shape":[2,1]},"z":{"data_offsets":[0,6],"dtype":"BF16","shape":[3]}}"#
    );
}

#[test]
fn config_json_is_pretty_with_sorted_keys() {
    let h = header(vec![]);
    assert_eq!(
        String::from_utf8(render_config(&h.model_config)).unwrap(),
        "{\n  \"a\": [\n    1.5e-12,\n    {\n      \"y\": true,\n      \"z\": null\n    }\n  ],\n  \"b\": 1\n}"
    );
}

#[test]
fn a_written_header_parses_back_with_exact_u64_digests() {
    let h = header(vec![tensor("w", Dtype::F32, &[4], 0)]);
    let p = parse(&archive(&h, 16)).unwrap();
    assert_eq!(p.header, h);
    assert_eq!(p.header.tensors[0].xxh3, u64::MAX - 1);
    assert_eq!(p.data_len, 16);
}

#[test]
fn every_structural_lie_is_refused() {
    let ok = archive(&header(vec![tensor("w", Dtype::F32, &[4], 0)]), 16);
    let mut huge = ok.clone();
    huge[12..20].copy_from_slice(&u64::MAX.to_le_bytes());
    assert!(matches!(
        parse(&huge),
        Err(BlazexError::HeaderPastEnd { .. })
    ));
    assert!(matches!(parse(&ok[..10]), Err(BlazexError::TooShort(10))));
    let mut v2 = ok.clone();
    v2[8] = 2;
    assert_eq!(parse(&v2).unwrap_err(), BlazexError::UnsupportedVersion(2));
    let past = archive(&header(vec![tensor("w", Dtype::F32, &[4], 1)]), 16);
    assert!(parse(&past)
        .unwrap_err()
        .to_string()
        .contains("past the end"));
    let overflow = archive(&header(vec![tensor("w", Dtype::F32, &[4], u64::MAX)]), 16);
    assert!(parse(&overflow).is_err());
    let shape = archive(
        &header(vec![tensor("w", Dtype::F32, &[u64::MAX, 2], 0)]),
        16,
    );
    assert!(parse(&shape).unwrap_err().to_string().contains("data_len"));
    let overlap = archive(
        &header(vec![
            tensor("a", Dtype::F32, &[4], 0),
            tensor("b", Dtype::F32, &[2], 8),
        ]),
        16,
    );
    assert!(matches!(parse(&overlap), Err(BlazexError::Overlap { .. })));
    for name in [
        "",
        "..",
        ".",
        "/etc/passwd",
        "a/b",
        "a\\b",
        "x\0",
        "config.json",
    ] {
        let mut h = header(vec![]);
        h.sidecar_files.push(Sidecar {
            filename: name.into(),
            content_b64: "AA==".into(),
        });
        let e = parse(&archive(&h, 0)).unwrap_err();
        assert!(matches!(e, BlazexError::Sidecar { .. }), "{name:?}: {e}");
    }
}

#[test]
fn empty_tensors_may_share_offsets() {
    let h = header(vec![
        tensor("a", Dtype::F32, &[0], 0),
        tensor("b", Dtype::F32, &[1], 0),
        tensor("c", Dtype::U8, &[0], 4),
    ]);
    parse(&archive(&h, 4)).unwrap();
}

/// A sealed archive of `h` (as `pack --format blazex` writes it) with
/// `data_len` bytes of DATA.
fn sealed(h: &Header, data_len: usize) -> Vec<u8> {
    let (p, j) = seal_header(&render_header(h)).expect("sealable");
    let mut v = p.to_vec();
    v.extend_from_slice(&j);
    v.resize(v.len() + data_len, 7);
    v
}

#[test]
fn a_sealed_header_reads_back_as_blazex_wrote_it_and_is_covered() {
    let h = header(vec![tensor("a", Dtype::F32, &[2], 0)]);
    let plain = parse(&archive(&h, 8)).unwrap();
    assert_eq!(plain.cover, HeaderCover::Uncovered);
    let v = sealed(&h, 8);
    let p = parse(&v).unwrap();
    assert_eq!(p.cover, HeaderCover::Sealed);
    assert_eq!(p.header, plain.header);
    // The digest is the last member; what precedes it is blazex's bytes.
    let json = std::str::from_utf8(&v[20..p.data_start as usize]).unwrap();
    let blazex_json = String::from_utf8(render_header(&h)).unwrap();
    assert!(json.starts_with(blazex_json.strip_suffix("\n}").unwrap()));
    assert!(json.ends_with("\"\n}"), "{json}");
    let member: serde_json::Value = serde_json::from_str(json).unwrap();
    assert_eq!(member[DIGEST_KEY].as_str().unwrap().len(), 16);
    // Sealing twice is refused (nothing to add).
    assert!(seal_header(&v[20..p.data_start as usize]).is_none());
}

#[test]
fn every_flipped_byte_of_a_sealed_prelude_or_header_fails_the_parse() {
    let mut h = header(vec![
        tensor("model.embed.weight", Dtype::Bf16, &[2, 3], 0),
        tensor("b", Dtype::I8, &[4], 12),
    ]);
    h.tokenizer = Some("{\"model\": {\"type\": \"BPE\"}}\n".into());
    h.sidecar_files.push(Sidecar {
        filename: "special_tokens_map.json".into(),
        content_b64: "eyJ1bmsiOiAiPHVuaz4ifQ==".into(),
    });
    // DATA that is whitespace: a header length grown into it still parses
    // as JSON, so only the digest can tell.
    let mut v = sealed(&h, 0);
    let data_start = v.len();
    v.extend_from_slice(&[b' '; 16]);
    h.tensors.clear();
    let good = parse(&v).unwrap();
    for at in 0..data_start {
        for mask in [0x01u8, 0x20, 0x80, 0xff] {
            let mut w = v.clone();
            w[at] ^= mask;
            match parse(&w) {
                Err(_) => {}
                Ok(p) => panic!(
                    "byte {at} ^ {mask:#04x} parsed ({:?}, {} tensors; original {})",
                    p.cover,
                    p.header.tensors.len(),
                    good.header.tensors.len()
                ),
            }
        }
    }
}

#[test]
fn a_digest_member_that_is_not_last_or_is_misnamed_is_refused() {
    let h = header(vec![]);
    let v = sealed(&h, 0);
    let json = std::str::from_utf8(&v[20..]).unwrap();
    // Moved to the front: valid JSON with the key, not where ckptfs writes it.
    let (body, tail) = json.split_at(json.rfind(",\n  \"ckptfs").unwrap());
    let member = tail.trim_start_matches(",\n").trim_end_matches("\n}");
    let moved = format!("{{\n{member},{}\n}}", &body[1..]);
    let mut w = render_prelude(moved.len() as u64).to_vec();
    w.extend_from_slice(moved.as_bytes());
    let e = parse(&w).unwrap_err();
    assert!(e.to_string().contains("not at the end"), "{e}");
    // A misnamed key of the same shape.
    let renamed = json.replace(DIGEST_KEY, "ckptfs_header_xxh4");
    let mut w = render_prelude(renamed.len() as u64).to_vec();
    w.extend_from_slice(renamed.as_bytes());
    let e = parse(&w).unwrap_err();
    assert!(e.to_string().contains("name is damaged"), "{e}");
}
