//! `ckptfs verify`: decode everything, check every structure and checksum;
//! on a store directory, every archive in it and every delta relation.

use super::{open_input, progress, Global, Input, Result};
use crate::archive::{write_frame, ArchiveView};
use crate::format::frame::Frame;
use anyhow::Context as _;
use rayon::prelude::*;
use std::path::Path;
use std::process::ExitCode;
use std::sync::Arc;

/// Checks one archive fully. Returns a one-line description on success.
pub fn verify_archive(a: &dyn ArchiveView, g: Global) -> Result<String> {
    let total = (0..a.files()).map(|i| a.logical_len(i)).sum();
    let pb = progress(g, total, "verify");
    let line = crate::archive::verify(a, &|n| pb.inc(n))?;
    pb.finish_and_clear();
    Ok(line)
}

/// `verify STORE`: every archive in the store decoded and checked, in
/// parallel under one progress bar (a delta against its base inside the
/// store), then every delta relation. Prints one line per archive, in
/// name order, and a summary naming each failed file; returns the number
/// of failures.
fn verify_store(g: Global, store: &Path) -> Result<usize> {
    let root = store
        .canonicalize()
        .with_context(|| store.display().to_string())?;
    let paths = super::delta::store_archives(&root)?;
    let opened: Vec<Result<Arc<dyn ArchiveView>>> = paths
        .par_iter()
        .map(|p| super::delta::open_in_store(&root, p))
        .collect();
    let total = opened
        .iter()
        .flatten()
        .map(|a| (0..a.files()).map(|i| a.logical_len(i)).sum::<u64>())
        .sum();
    let pb = progress(g, total, &format!("verify {}", store.display()));
    let results: Vec<Result<String>> = opened
        .into_par_iter()
        .map(|a| Ok(crate::archive::verify(&*a?, &|n| pb.inc(n))?))
        .collect();
    pb.finish_and_clear();
    let mut bad = Vec::new();
    for (p, r) in paths.iter().zip(results) {
        let shown = p.strip_prefix(&root).unwrap_or(p).display().to_string();
        match r {
            Ok(msg) => println!("OK    {shown}: {msg}"),
            Err(e) => {
                // Errors name the full path; the store-relative one is enough.
                let e = super::one_line(&*e);
                let full = p.display().to_string();
                match e.strip_prefix(&full) {
                    Some(rest) => println!("FAIL  {shown}{rest}"),
                    None => println!("FAIL  {shown}: {e}"),
                }
                bad.push(shown);
            }
        }
    }
    let (n, bad_rel) = super::delta::verify_store(&root)?;
    println!(
        "{}: {} verified, {} failed; {} checked, {bad_rel} failed",
        store.display(),
        super::plural(paths.len(), "archive", "archives"),
        bad.len(),
        super::plural(n, "delta relation", "delta relations"),
    );
    if !bad.is_empty() {
        println!("{}: failed: {}", store.display(), bad.join(", "));
    }
    Ok(bad.len() + bad_rel)
}

pub fn run(g: Global, a: crate::cli::VerifyArgs) -> Result<ExitCode> {
    let mut failed = 0;
    for path in &a.files {
        if path.is_dir() {
            failed += verify_store(g, path)?;
            continue;
        }
        let delta = super::z4delta::peek(path);
        let r: Result<String> = match (delta, &a.base) {
            (Some(kind), Some(base)) => super::z4delta::verify(path, kind, base),
            (Some(kind), None) => Err(super::z4delta::needs_base(path, kind)),
            (None, Some(_)) => Err(super::z4delta::base_not_applicable(path)),
            (None, None) => match open_input(path) {
                Ok(Input::Archive(ar)) => verify_archive(&*ar, g),
                Ok(Input::Frame(map)) => (|| {
                    let f = Frame::parse(&map).with_context(|| path.display().to_string())?;
                    let n = write_frame(&map, path, &mut std::io::sink())?;
                    Ok(format!(
                        "z4ai frame {}, {} -> {} bytes",
                        f.kind_tag(),
                        n,
                        map.len()
                    ))
                })(),
                Err(e) => Err(e),
            },
        };
        match r {
            Ok(msg) => println!("OK    {}: {msg}", super::s3::shown(path)),
            Err(e) => {
                failed += 1;
                let e = super::s3::named(&super::one_line(&*e));
                let shown = super::s3::shown(path);
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
