//! ckptfs `.blz` model archives on the command line: `pack DIR -o X.blz`
//! and `info` (dispatched here from their modules by magic or output name;
//! `unpack`, `verify`, `list` and `extract` work on every kind of archive
//! through `crate::archive` and `crate::model`).

use super::{plural, progress, Global, Result};
use crate::archive::{ArchiveView, BlzArchive};
use crate::format::blz::{Content, FileKind, Stored, MAGIC};
use crate::pack::{pack_dir, BlzOptions, PackOptions};
use std::io::Read;
use std::path::Path;
use std::time::Instant;

/// True when `path` starts with the `.blz` magic.
pub fn is_blz(path: &Path) -> bool {
    let mut m = [0u8; 8];
    std::fs::File::open(path)
        .and_then(|mut f| f.read_exact(&mut m))
        .is_ok()
        && &m == MAGIC
}

pub fn open(path: &Path) -> Result<BlzArchive> {
    Ok(BlzArchive::open(path)?)
}

pub fn pack(g: Global, src: &Path, out: &Path, raw: bool, level: i32, force: bool) -> Result<()> {
    let opts = BlzOptions {
        raw,
        pack: PackOptions {
            level,
            ..PackOptions::default()
        },
    };
    let t = Instant::now();
    let total = crate::pack::walk(src, None)
        .map(|v| {
            v.iter()
                .filter_map(|(_, p)| std::fs::metadata(p).ok())
                .map(|m| m.len())
                .sum()
        })
        .unwrap_or(0);
    let pb = progress(g, total, "pack");
    let s = pack_dir(src, out, opts, force, &|n| pb.inc(n))?;
    pb.finish_and_clear();
    if !g.quiet {
        let secs = t.elapsed().as_secs_f64();
        eprintln!(
            "{} -> {}: {} ({}, {}, {}), {} -> {} bytes, ratio {:.4}, {:.0} MB/s",
            src.display(),
            out.display(),
            plural(s.files, "file", "files"),
            plural(s.shards, "shard", "shards"),
            plural(s.tensors, "tensor", "tensors"),
            match s.deduplicated {
                0 => "no duplicate tensors".to_string(),
                n => format!(
                    "{} not stored again",
                    plural(n, "duplicate tensor", "duplicate tensors")
                ),
            },
            s.raw_bytes,
            s.stored_bytes,
            s.raw_bytes as f64 / s.stored_bytes.max(1) as f64,
            s.raw_bytes as f64 / 1e6 / secs.max(1e-9)
        );
    }
    Ok(())
}

pub fn info(path: &Path, json: bool) -> Result<()> {
    let a = open(path)?;
    let raw: u64 = a.entries().iter().map(|f| f.size).sum();
    let shards = a
        .entries()
        .iter()
        .filter(|f| f.kind() == FileKind::Safetensors)
        .count();
    let tensors: usize = a.entries().iter().map(|f| f.tensors().len()).sum();
    let ratio = raw as f64 / a.stored_len().max(1) as f64;
    let encodings = {
        let mut m = std::collections::BTreeMap::<String, usize>::new();
        for u in 0..a.units() as u32 {
            let e = serde_json::to_value(a.blob(u).encoding).unwrap_or_default();
            *m.entry(e.as_str().unwrap_or("?").to_string()).or_default() += 1;
        }
        m
    };
    if json {
        let files: Vec<serde_json::Value> = a
            .entries()
            .iter()
            .map(|f| {
                serde_json::json!({
                    "path": f.path,
                    "kind": f.kind(),
                    "size": f.size,
                    "tensors": f.tensors().len(),
                })
            })
            .collect();
        let v = serde_json::json!({
            "file": path.display().to_string(),
            "format": "blz v1",
            "files": files,
            "shards": shards,
            "tensors": tensors,
            "blobs": a.units(),
            "blob_encodings": encodings,
            "raw_bytes": raw,
            "stored_bytes": a.stored_len(),
            "ratio": ratio,
        });
        println!("{}", serde_json::to_string_pretty(&v)?);
        return Ok(());
    }
    println!("{}", path.display());
    println!("  format        blz v{}", crate::format::blz::VERSION);
    println!(
        "  files         {} ({shards} safetensors shards)",
        a.entries().len()
    );
    println!(
        "  tensors       {tensors} ({} blobs: {})",
        a.units(),
        encodings
            .iter()
            .map(|(k, v)| format!("{k} ×{v}"))
            .collect::<Vec<_>>()
            .join(", ")
    );
    println!("  raw bytes     {raw}");
    println!("  stored bytes  {}", a.stored_len());
    println!("  ratio         {ratio:.4}");
    println!("  {:<56} {:>12} {:>8}  kind", "path", "size", "tensors");
    for f in a.entries() {
        let stored = match &f.content {
            Content::Plain {
                stored: Stored::Text(_),
                ..
            } => "file (text)",
            Content::Plain {
                stored: Stored::Base64(_),
                ..
            } => "file (base64)",
            Content::Plain {
                stored: Stored::Blob(_),
                ..
            } => "file (blob)",
            Content::Shard(_) => "safetensors",
        };
        println!(
            "  {:<56} {:>12} {:>8}  {stored}",
            f.path,
            f.size,
            f.tensors().len(),
        );
    }
    Ok(())
}
