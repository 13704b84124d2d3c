//! JSON laid out as `serde_json::to_vec_pretty` lays it out (what blazex
//! writes), keeping every string and number token as it was spelled.
//!
//! A `.blzdiff` carries the target's whole header inside its manifest.
//! Parsing it into values and rendering them again loses how its writer
//! spelled them (`\u00e9` or `é`, `1e-05` or `1e-5`), so the archive `apply`
//! writes would differ from the target byte for byte. [`reindent`] moves
//! the carried header's tokens to the top level instead, changing only
//! whitespace; [`same_tokens`] tells whether two renderings hold the same
//! values in the same order, so the caller can keep the carried spelling
//! only where it means exactly what ckptfs would write.
//!
//! Pure, over `&[u8]` of JSON that serde has already accepted; anything
//! else (or nesting deeper than [`MAX_DEPTH`]) gives None.

use std::ops::Range;

/// Nesting deeper than this is not laid out (serde_json stops at 128).
const MAX_DEPTH: usize = 256;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Tok<'a> {
    Open(u8),
    Close(u8),
    Colon,
    Comma,
    Str(&'a [u8]),
    Scalar(&'a [u8]),
}

fn tokens(json: &[u8]) -> Option<Vec<(Tok<'_>, usize)>> {
    let mut out = Vec::new();
    let mut i = 0;
    while i < json.len() {
        let c = json[i];
        let start = i;
        let t = match c {
            b' ' | b'\t' | b'\n' | b'\r' => {
                i += 1;
                continue;
            }
            b'{' | b'[' => Tok::Open(c),
            b'}' | b']' => Tok::Close(c),
            b':' => Tok::Colon,
            b',' => Tok::Comma,
            b'"' => {
                i += 1;
                while i < json.len() && json[i] != b'"' {
                    i += if json[i] == b'\\' { 2 } else { 1 };
                }
                if i >= json.len() {
                    return None;
                }
                Tok::Str(&json[start..=i])
            }
            _ => {
                while i + 1 < json.len()
                    && !matches!(
                        json[i + 1],
                        b' ' | b'\t'
                            | b'\n'
                            | b'\r'
                            | b'{'
                            | b'['
                            | b'}'
                            | b']'
                            | b':'
                            | b','
                            | b'"'
                    )
                {
                    i += 1;
                }
                Tok::Scalar(&json[start..=i])
            }
        };
        out.push((t, start));
        i += 1;
    }
    Some(out)
}

/// The byte range of the value of top-level member `key` of the JSON
/// object `json`.
pub fn member_span(json: &[u8], key: &str) -> Option<Range<usize>> {
    let toks = tokens(json)?;
    let want = serde_json::to_vec(key).ok()?;
    let mut depth = 0usize;
    let mut k = 0;
    while k < toks.len() {
        match toks[k].0 {
            Tok::Open(_) => depth += 1,
            Tok::Close(_) => depth = depth.checked_sub(1)?,
            Tok::Str(s) if depth == 1 && s == want.as_slice() => {
                if toks.get(k + 1)?.0 != Tok::Colon {
                    return None;
                }
                let start = toks.get(k + 2)?.1;
                // The value ends where its depth comes back.
                let mut d = 0usize;
                for &(t, at) in &toks[k + 2..] {
                    match t {
                        Tok::Open(_) => d += 1,
                        Tok::Close(_) => {
                            d = d.checked_sub(1)?;
                            if d == 0 {
                                return Some(start..at + 1);
                            }
                        }
                        Tok::Str(s) | Tok::Scalar(s) if d == 0 => {
                            return Some(start..start + s.len());
                        }
                        _ => {}
                    }
                }
                return None;
            }
            _ => {}
        }
        k += 1;
    }
    None
}

/// `value` laid out as serde_json's pretty printer does at the top level
/// (2-space indent, `": "`, empty containers as `{}`/`[]`), its string and
/// number tokens kept byte for byte.
pub fn reindent(value: &[u8]) -> Option<Vec<u8>> {
    let toks = tokens(value)?;
    let mut out = Vec::with_capacity(value.len());
    let mut depth = 0usize;
    let newline = |out: &mut Vec<u8>, depth: usize| {
        out.push(b'\n');
        out.resize(out.len() + 2 * depth, b' ');
    };
    for (k, &(t, _)) in toks.iter().enumerate() {
        match t {
            Tok::Open(c) => {
                out.push(c);
                depth += 1;
                if depth > MAX_DEPTH {
                    return None;
                }
                if !matches!(toks.get(k + 1), Some((Tok::Close(_), _))) {
                    newline(&mut out, depth);
                }
            }
            Tok::Close(c) => {
                depth = depth.checked_sub(1)?;
                if !matches!(toks.get(k.wrapping_sub(1)), Some((Tok::Open(_), _))) {
                    newline(&mut out, depth);
                }
                out.push(c);
            }
            Tok::Colon => out.extend_from_slice(b": "),
            Tok::Comma => {
                out.push(b',');
                newline(&mut out, depth);
            }
            Tok::Str(s) | Tok::Scalar(s) => out.extend_from_slice(s),
        }
    }
    (depth == 0).then_some(out)
}

/// True when `a` and `b` hold the same tokens in the same order, a string
/// or number in one spelled however it is in the other as long as it means
/// the same value.
pub fn same_tokens(a: &[u8], b: &[u8]) -> bool {
    let (Some(ta), Some(tb)) = (tokens(a), tokens(b)) else {
        return false;
    };
    ta.len() == tb.len()
        && ta.iter().zip(&tb).all(|(&(x, _), &(y, _))| match (x, y) {
            (Tok::Str(p), Tok::Str(q)) | (Tok::Scalar(p), Tok::Scalar(q)) => {
                p == q
                    || matches!(
                        (
                            serde_json::from_slice::<serde_json::Value>(p),
                            serde_json::from_slice::<serde_json::Value>(q),
                        ),
                        (Ok(v), Ok(w)) if v == w
                    )
            }
            (x, y) => x == y,
        })
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn reindenting_serde_output_at_depth_one_gives_serde_output_at_the_top() {
        let v = json!({
            "version": 1,
            "empty": {}, "none": [], "n": null,
            "nested": {"a": [1, 2.5, {"b": "x\"y\\n"}], "c": [[]]},
            "s": "é \u{1}"
        });
        let outer = serde_json::to_vec_pretty(&json!({"m": 2, "target_header": v})).unwrap();
        let span = member_span(&outer, "target_header").unwrap();
        assert_eq!(
            reindent(&outer[span]).unwrap(),
            serde_json::to_vec_pretty(&v).unwrap()
        );
        assert_eq!(member_span(&outer, "m").map(|r| &outer[r]), Some(&b"2"[..]));
        assert_eq!(member_span(&outer, "version"), None);
    }

    #[test]
    fn spellings_are_kept_and_compared_by_value() {
        let carried = br#"{"s": "\u00e9\/", "f": 1e-05, "a": []}"#;
        let out = reindent(carried).unwrap();
        assert_eq!(
            out,
            b"{\n  \"s\": \"\\u00e9\\/\",\n  \"f\": 1e-05,\n  \"a\": []\n}".to_vec()
        );
        let ours = serde_json::to_vec_pretty(&json!({"s": "é/", "f": 1e-5, "a": []})).unwrap();
        assert!(same_tokens(&out, &ours));
        let other = serde_json::to_vec_pretty(&json!({"s": "é/", "f": 2e-5, "a": []})).unwrap();
        assert!(!same_tokens(&out, &other));
        let reordered = serde_json::to_vec_pretty(&json!({"f": 1e-5, "s": "é/", "a": []})).unwrap();
        assert!(!same_tokens(&out, &reordered));
    }
}
