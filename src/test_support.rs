//! Test helpers shared by the unit tests in src/ and the integration tests
//! in tests/: the library compiles this file under `#[cfg(test)]`, and
//! tests/common includes the same file with `#[path]`, so there is one copy.
//! It must depend on std only (it is compiled in both crates) and holds no
//! state.

use std::path::{Path, PathBuf};

/// tests/vectors: the committed test vectors (archives and their originals).
pub fn vectors_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/vectors")
}

/// Stems of the vector archives (`STEM.zstn`) that have an original
/// `STEM.safetensors`, sorted.
pub fn vector_stems() -> Vec<String> {
    let mut v: Vec<String> = std::fs::read_dir(vectors_dir())
        .unwrap()
        .filter_map(|e| {
            let n = e.unwrap().file_name().into_string().unwrap();
            n.strip_suffix(".zstn").map(str::to_string)
        })
        .filter(|s| vectors_dir().join(format!("{s}.safetensors")).exists())
        .collect();
    v.sort();
    v
}
