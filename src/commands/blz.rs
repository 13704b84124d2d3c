//! ckptfs `.blz` model archives on the command line: `pack DIR -o X.blz`
//! and `info` (dispatched here from their modules by magic or output name),
//! and `list` and `extract`, which only exist for `.blz` (`unpack` and
//! `verify` work on every kind of archive through `crate::archive`).

use super::{progress, Global, Result};
use crate::archive::{ArchiveView, BlzArchive};
use crate::cli::{ExtractArgs, ListArgs};
use crate::format::blz::{Content, FileKind, Stored, MAGIC};
use crate::fsutil::write_atomic;
use crate::pack::{pack_dir, BlzOptions, PackOptions};
use anyhow::Context as _;
use std::io::{Read, Write};
use std::path::Path;
use std::process::ExitCode;
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
        pack: PackOptions { level },
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
            "{} -> {}: {} files ({} shards, {} tensors, {} stored once more), {} -> {} bytes, ratio {:.4}, {:.0} MB/s",
            src.display(),
            out.display(),
            s.files,
            s.shards,
            s.tensors,
            s.deduplicated,
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

pub fn list(_g: Global, a: ListArgs) -> Result<ExitCode> {
    let ar = open(&a.input)?;
    let mut out = std::io::stdout().lock();
    for f in ar.entries() {
        for t in f.tensors() {
            if a.filter
                .as_ref()
                .is_some_and(|s| !t.name.contains(s.as_str()))
            {
                continue;
            }
            let shape: Vec<String> = t.shape.iter().map(|d| d.to_string()).collect();
            let r = writeln!(
                out,
                "{:<64} {:>8} {:>20} {:>12}  {}",
                t.name,
                t.dtype,
                format!("[{}]", shape.join(", ")),
                t.len(),
                f.path
            );
            if r.is_err() {
                // A closed pipe (`| head`) ends the listing quietly.
                return Ok(ExitCode::SUCCESS);
            }
        }
    }
    Ok(ExitCode::SUCCESS)
}

/// (file index, tensor index) of a tensor named `NAME` or `FILE:NAME`.
fn find_tensor(a: &BlzArchive, spec: &str) -> Result<(usize, usize)> {
    let hits = |name: &str, file: Option<&str>| -> Vec<(usize, usize)> {
        let mut v = Vec::new();
        for (i, f) in a.entries().iter().enumerate() {
            if file.is_some_and(|p| p != f.path) {
                continue;
            }
            for (t, te) in f.tensors().iter().enumerate() {
                if te.name == name {
                    v.push((i, t));
                }
            }
        }
        v
    };
    let mut found = hits(spec, None);
    if found.is_empty() {
        if let Some((file, name)) = spec.split_once(':') {
            found = hits(name, Some(file));
        }
    }
    match found.len() {
        0 => Err(anyhow::anyhow!(
            "{}: no tensor {spec:?}",
            a.path().display()
        )),
        1 => Ok(found[0]),
        _ => Err(anyhow::anyhow!(
            "{}: tensor {spec:?} is in {}; name it as FILE:NAME",
            a.path().display(),
            found
                .iter()
                .map(|(i, _)| a.entries()[*i].path.as_str())
                .collect::<Vec<_>>()
                .join(" and ")
        )),
    }
}

pub fn extract(_g: Global, a: ExtractArgs) -> Result<ExitCode> {
    let ar = open(&a.input)?;
    let picked: Vec<(usize, usize)> = a
        .tensors
        .iter()
        .map(|s| find_tensor(&ar, s))
        .collect::<Result<_>>()?;
    std::fs::create_dir_all(&a.output).with_context(|| a.output.display().to_string())?;
    if a.safetensors {
        let stem = a
            .input
            .file_stem()
            .map(|s| s.to_string_lossy().into_owned())
            .unwrap_or_else(|| "tensors".into());
        let p = a.output.join(format!("{stem}.safetensors"));
        let mut header = serde_json::Map::new();
        let mut datas = Vec::with_capacity(picked.len());
        let mut off = 0u64;
        for &(i, t) in &picked {
            let te = &ar.entries()[i].tensors()[t];
            if header.contains_key(&te.name) {
                return Err(anyhow::anyhow!("tensor {:?} named twice", te.name));
            }
            let d = ar.tensor_bytes(i, t)?;
            header.insert(
                te.name.clone(),
                serde_json::json!({
                    "dtype": te.dtype,
                    "shape": te.shape,
                    "data_offsets": [off, off + d.len() as u64],
                }),
            );
            off += d.len() as u64;
            datas.push(d);
        }
        let mut h = serde_json::to_vec(&header)?;
        while h.len() % 8 != 0 {
            h.push(b' ');
        }
        write_atomic(&p, a.force, |w| {
            w.write_all(&(h.len() as u64).to_le_bytes())?;
            w.write_all(&h)?;
            for d in &datas {
                w.write_all(d)?;
            }
            Ok(())
        })
        .with_context(|| p.display().to_string())?;
        eprintln!("{}: {} tensors", p.display(), picked.len());
        return Ok(ExitCode::SUCCESS);
    }
    for &(i, t) in &picked {
        let te = &ar.entries()[i].tensors()[t];
        let d = ar.tensor_bytes(i, t)?;
        let p = a
            .output
            .join(format!("{}.bin", te.name.replace(['/', '\0'], "_")));
        write_atomic(&p, a.force, |w| w.write_all(&d)).with_context(|| p.display().to_string())?;
        eprintln!(
            "{}: {} {:?} {} bytes",
            p.display(),
            te.dtype,
            te.shape,
            d.len()
        );
    }
    Ok(ExitCode::SUCCESS)
}
