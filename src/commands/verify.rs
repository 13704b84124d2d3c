//! `ckptfs verify`: decode everything, check every structure and checksum.

use super::{open_input, progress, Global, Input, Result};
use crate::archive::Archive;
use crate::format::frame::Frame;
use crate::format::zstn::Layout;
use rayon::prelude::*;
use std::process::ExitCode;

/// Checks one archive fully. Returns a one-line description on success.
pub fn verify_archive(
    a: &Archive,
    g: Global,
) -> std::result::Result<String, crate::commands::Error> {
    // Every header tensor must match a record of the same name and span.
    if let Layout::Indexed { records, .. } = &a.container().layout {
        let h = a.header().ok_or_else(|| {
            format!(
                "{}: header: {}",
                a.path().display(),
                a.header_error().unwrap_or("")
            )
        })?;
        let tensors = h.tensors.len();
        if tensors != records.len() {
            return Err(format!(
                "{}: header lists {tensors} tensors, index holds {} records",
                a.path().display(),
                records.len()
            )
            .into());
        }
        for t in &h.tensors {
            match records.iter().find(|r| r.name == t.name) {
                Some(r) if r.begin == t.begin && r.end == t.end => {}
                Some(r) => {
                    return Err(format!(
                        "{}: tensor {:?}: header span [{}, {}) but index span [{}, {})",
                        a.path().display(),
                        t.name,
                        t.begin,
                        t.end,
                        r.begin,
                        r.end
                    )
                    .into())
                }
                None => {
                    return Err(format!(
                        "{}: tensor {:?} has no index record",
                        a.path().display(),
                        t.name
                    )
                    .into())
                }
            }
        }
    }
    let pb = progress(g, a.logical_len(), "verify");
    (0..a.units() as u32).into_par_iter().try_for_each(|u| {
        a.verify_frame(u)?;
        let grid = a.grid(u)?;
        (0..grid.blocks() as u32)
            .into_par_iter()
            .try_for_each(|block| {
                let d = a.decode_block(crate::archive::BlockKey { unit: u, block })?;
                pb.inc(d.len() as u64);
                Ok::<_, crate::archive::ArchiveError>(())
            })
    })?;
    pb.finish_and_clear();
    let strict = a
        .header()
        .and_then(|h| h.validate(a.container().data_len).err())
        .map(|e| format!("; note: not strict safetensors: {e}"))
        .unwrap_or_default();
    Ok(format!(
        "{} tensors, {} -> {} bytes, ratio {:.4}, {}{}",
        a.header().map_or(0, |h| h.tensors.len()),
        a.logical_len(),
        a.stored_len(),
        a.logical_len() as f64 / a.stored_len().max(1) as f64,
        if a.extension().is_some() {
            "all checksums verified"
        } else {
            "no checksums (z4ai file): structure and lengths verified"
        },
        strict
    ))
}

pub fn run(g: Global, a: crate::cli::VerifyArgs) -> Result<ExitCode> {
    let mut failed = 0;
    for path in &a.files {
        let r: Result<String> = if super::blz::is_blz(path) {
            super::blz::verify(g, path)
        } else {
            match open_input(path) {
                Ok(Input::Zstn(ar)) => verify_archive(&ar, g),
                Ok(Input::Frame(map)) => (|| {
                    let f = Frame::parse(&map).map_err(|e| format!("{}: {e}", path.display()))?;
                    let mut out = vec![0u8; f.decoded_len() as usize];
                    f.decode(&mut out)
                        .map_err(|e| format!("{}: {e}", path.display()))?;
                    Ok(format!(
                        "z4ai frame {}, {} -> {} bytes",
                        f.kind_tag(),
                        out.len(),
                        map.len()
                    ))
                })(),
                Err(e) => Err(e),
            }
        };
        match r {
            Ok(msg) => println!("OK    {}: {msg}", path.display()),
            Err(e) => {
                failed += 1;
                let e = e.to_string();
                let shown = path.display().to_string();
                if e.starts_with(&shown) {
                    println!("FAIL  {e}");
                } else {
                    println!("FAIL  {shown}: {e}");
                }
            }
        }
    }
    Ok(if failed > 0 {
        ExitCode::from(1)
    } else {
        ExitCode::SUCCESS
    })
}
