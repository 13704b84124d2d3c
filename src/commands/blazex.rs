//! BLAZE-X `.blz` archives (the `blazex` tool's) on the command line:
//! `info` (dispatched here by magic) and `pack --format blazex`. `unpack`, `verify`, `list` and
//! `extract` work on them through `crate::archive` like on every kind.

use super::{progress, Global, Result};
use crate::archive::{ArchiveView, BlazexArchive};
use std::collections::BTreeMap;
use std::path::Path;
use std::time::Instant;

/// `ckptfs pack DIR -o NAME.blz --format blazex`.
pub fn pack(g: Global, src: &Path, out: &Path, force: bool) -> Result<()> {
    let t = Instant::now();
    let total = std::fs::read_dir(src)
        .map(|rd| {
            rd.filter_map(|e| e.ok()?.metadata().ok())
                .map(|m| m.len())
                .sum()
        })
        .unwrap_or(0);
    let pb = progress(g, total, "pack");
    let s = crate::pack::pack_blazex(src, out, force, &|n| pb.inc(n))?;
    pb.finish_and_clear();
    if !g.quiet {
        let secs = t.elapsed().as_secs_f64();
        eprintln!(
            "{} -> {}: BLAZE-X v1, {}, {}, {}, {} data bytes, {} stored, {:.0} MB/s",
            src.display(),
            out.display(),
            super::plural(s.shards, "shard", "shards"),
            super::plural(s.tensors, "tensor", "tensors"),
            super::plural(s.sidecars, "sidecar", "sidecars"),
            s.data_bytes,
            s.stored_bytes,
            s.data_bytes as f64 / 1e6 / secs.max(1e-9)
        );
    }
    Ok(())
}

/// What a BLAZE-X archive holds, for `info --json`.
pub fn info_json(a: &BlazexArchive) -> serde_json::Value {
    let (h, raw, dtypes, files) = summary(a);
    serde_json::json!({
        "file": a.path().display().to_string(),
        "format": "BLAZE-X blz v1",
        "created_at": h.created_at,
        "files": files.iter().map(|(p, n)| serde_json::json!({"path": p, "size": n})).collect::<Vec<_>>(),
        "tensors": a.tensors().len(),
        "dtypes": dtypes,
        "raw_bytes": raw,
        "stored_bytes": a.stored_len(),
        "data_sha256": h.data_sha256,
        "header_digest": a.uncovered().is_none(),
        "not_covered": a.uncovered(),
        "tensor_list": a.tensors().iter().map(|t| serde_json::json!({
            "name": t.name,
            "dtype": t.dtype.safetensors_name(),
            "shape": t.shape,
            "bytes": t.data_len,
            "xxh3": format!("{:016x}", t.xxh3),
        })).collect::<Vec<_>>(),
    })
}

type Summary<'a> = (
    &'a crate::format::blazex::Header,
    u64,
    BTreeMap<&'static str, usize>,
    Vec<(String, u64)>,
);

fn summary(a: &BlazexArchive) -> Summary<'_> {
    let h = a.header();
    let raw: u64 = a.tensors().iter().map(|t| t.data_len).sum();
    let mut dtypes = BTreeMap::<&str, usize>::new();
    for t in a.tensors() {
        *dtypes.entry(t.dtype.safetensors_name()).or_default() += 1;
    }
    let files: Vec<(String, u64)> = (0..a.files())
        .map(|i| (a.file_path(i).to_string(), a.logical_len(i)))
        .collect();
    (h, raw, dtypes, files)
}

/// Prints what a BLAZE-X archive holds: its files, dtypes, every tensor.
pub fn print_info(a: &BlazexArchive, per_tensor: bool) {
    let (h, raw, dtypes, files) = summary(a);
    println!("{}", a.path().display());
    println!("  format        BLAZE-X blz v1 (uncompressed; xxh3 per tensor, data SHA-256)");
    match a.uncovered() {
        None => println!(
            "  checksums     every byte: tensors (xxh3), header ({})",
            crate::format::blazex::DIGEST_KEY
        ),
        Some(what) => println!("  checksums     tensors only (xxh3): {what}"),
    }
    println!("  created_at    {}", h.created_at);
    println!(
        "  tensors       {} ({})",
        a.tensors().len(),
        dtypes
            .iter()
            .map(|(k, v)| format!("{k} ×{v}"))
            .collect::<Vec<_>>()
            .join(", ")
    );
    println!("  tensor bytes  {raw}");
    println!("  stored bytes  {}", a.stored_len());
    println!("  {:<56} {:>12}", "presented file", "size");
    for (p, n) in &files {
        println!("  {p:<56} {n:>12}");
    }
    if per_tensor {
        println!("  {:<56} {:>6} {:>12}  shape", "tensor", "dtype", "bytes");
        for t in a.tensors() {
            println!(
                "  {:<56} {:>6} {:>12}  {:?}",
                t.name,
                t.dtype.safetensors_name(),
                t.data_len,
                t.shape
            );
        }
    }
}
