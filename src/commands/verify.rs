//! `ckptfs verify`: decode everything, check every structure and checksum.

use super::{open_input, progress, Global, Input, Result};
use crate::archive::{write_frame, ArchiveView};
use crate::format::frame::Frame;
use anyhow::Context as _;
use std::process::ExitCode;

/// Checks one archive fully. Returns a one-line description on success.
pub fn verify_archive(a: &dyn ArchiveView, g: Global) -> Result<String> {
    let total = (0..a.files()).map(|i| a.logical_len(i)).sum();
    let pb = progress(g, total, "verify");
    let line = crate::archive::verify(a, &|n| pb.inc(n))?;
    pb.finish_and_clear();
    Ok(line)
}

pub fn run(g: Global, a: crate::cli::VerifyArgs) -> Result<ExitCode> {
    let mut failed = 0;
    for path in &a.files {
        if path.is_dir() {
            // A store: every delta relation in it.
            let (n, bad) = super::delta::verify_store(path)?;
            println!(
                "{}: {n} delta relations checked, {bad} failed",
                super::s3::shown(path)
            );
            failed += bad;
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
