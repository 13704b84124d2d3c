//! The CLI side of z4ai's deltas (`.z4dm`, `.z4dl`): `unpack --base`,
//! `verify --base` and `info [--base]`. The decoding is `crate::z4delta`'s;
//! here are file names, atomic output and messages.

use super::{progress, Global, Result};
use crate::format::z4dl::{hex, Z4dl};
use crate::fsutil::write_atomic;
use crate::z4delta::{summarize_z4dm, Base, DeltaError, DeltaKind, Z4dlReader, Z4dmReader};
use anyhow::Context as _;
use std::path::{Path, PathBuf};

/// The z4ai delta kind of the file at `path`, from its magic (None for
/// anything else, including unreadable files: the caller's own open
/// reports those). A ckptfs delta archive (a `Z4DM` ending with its `CKD1`
/// trailer, doc/FORMAT.md §6) records its base and is an archive: None.
pub fn peek(path: &Path) -> Option<DeltaKind> {
    use std::io::{Read, Seek, SeekFrom};
    let mut head = [0u8; 4];
    let mut f = std::fs::File::open(path).ok()?;
    f.read_exact(&mut head).ok()?;
    let kind = DeltaKind::detect(&head)?;
    let mut tail = [0u8; 4];
    if &head == crate::format::delta::Z4DM_MAGIC
        && f.seek(SeekFrom::End(-4)).is_ok()
        && f.read_exact(&mut tail).is_ok()
        && &tail == crate::format::delta::TRAILER_MAGIC
    {
        return None;
    }
    Some(kind)
}

/// The error for a delta given without its base.
pub fn needs_base(path: &Path, kind: DeltaKind) -> anyhow::Error {
    anyhow::anyhow!(
        "{}: {}: give the checkpoint it was built against with --base BASE",
        path.display(),
        kind.describe()
    )
}

/// The error for `--base` given with something that is not a z4ai delta.
pub fn base_not_applicable(path: &Path) -> anyhow::Error {
    anyhow::anyhow!(
        "{}: --base applies only to z4ai deltas (.z4dm, .z4dl); this file is not one",
        path.display()
    )
}

fn map(path: &Path) -> Result<memmap2::Mmap> {
    let f = std::fs::File::open(path).with_context(|| path.display().to_string())?;
    // SAFETY: read-only private map of a file we only read.
    unsafe { memmap2::Mmap::map(&f) }.with_context(|| path.display().to_string())
}

/// Default output: `X.z4dm` -> `X.safetensors`; `X.z4dl` -> `X` (else
/// `X.out`).
pub fn default_output(input: &Path, kind: DeltaKind) -> PathBuf {
    let s = input.to_string_lossy();
    match kind {
        DeltaKind::Z4dm => {
            let stem = s.strip_suffix(".z4dm").unwrap_or(&s);
            if stem.ends_with(".safetensors") {
                PathBuf::from(stem)
            } else {
                PathBuf::from(format!("{stem}.safetensors"))
            }
        }
        DeltaKind::Z4dl => PathBuf::from(match s.strip_suffix(".z4dl") {
            Some(stem) if !stem.is_empty() => stem.to_string(),
            _ => format!("{s}.out"),
        }),
    }
}

/// `ckptfs unpack DELTA --base BASE [-o OUT]`. The base is checked before
/// the output is created; a failure later leaves no output behind.
pub fn unpack(
    g: Global,
    input: &Path,
    kind: DeltaKind,
    base: &Path,
    output: Option<PathBuf>,
    force: bool,
) -> Result<()> {
    let bytes = map(input)?;
    let base = Base::open(base)?;
    let out = output.unwrap_or_else(|| default_output(input, kind));
    if out == Path::new("-") {
        // `-o -`: standard output, as for any archive.
        let r = match kind {
            DeltaKind::Z4dm => {
                let r = Z4dmReader::open(input, &bytes, &base)?;
                super::unpack::write_standard_output(|w| {
                    r.write_to(w, &|_| {}).map_err(std::io::Error::other)
                })
            }
            DeltaKind::Z4dl => {
                let r = Z4dlReader::open(input, &bytes, &base)?;
                super::unpack::write_standard_output(|w| {
                    r.write_to(w).map_err(std::io::Error::other)
                })
            }
        };
        return r.map_err(|e| unwrap_delta(e, "standard output"));
    }
    let oname = out.display().to_string();
    match kind {
        DeltaKind::Z4dm => {
            let r = Z4dmReader::open(input, &bytes, &base)?;
            let pb = progress(g, r.target_len(), "unpack");
            write_atomic(&out, force, |f| {
                r.write_to(f, &|n| pb.inc(n)).map_err(std::io::Error::other)
            })
            .map_err(|e| unwrap_delta(e, &oname))?;
            pb.finish_and_clear();
        }
        DeltaKind::Z4dl => {
            let r = Z4dlReader::open(input, &bytes, &base)?;
            write_atomic(&out, force, |f| {
                r.write_to(f).map_err(std::io::Error::other)
            })
            .map_err(|e| unwrap_delta(e, &oname))?;
        }
    }
    Ok(())
}

/// An error out of `write_atomic`: a decoding error comes back as it is
/// (it names the delta and the tensor); an I/O error names the output.
fn unwrap_delta(e: std::io::Error, out: &str) -> anyhow::Error {
    match e.downcast::<DeltaError>() {
        Ok(DeltaError::Write(e)) => anyhow::Error::new(e).context(out.to_string()),
        Ok(d) => d.into(),
        Err(e) => anyhow::Error::new(e).context(out.to_string()),
    }
}

/// `ckptfs verify DELTA --base BASE`: decodes everything against the base
/// (every digest z4ai records, every frame). Returns the summary line.
pub fn verify(input: &Path, kind: DeltaKind, base: &Path) -> Result<String> {
    let bytes = map(input)?;
    let base = Base::open(base)?;
    let mut sink = CountingSink(0);
    match kind {
        DeltaKind::Z4dm => {
            let s = summarize_z4dm(input, &bytes)?;
            let r = Z4dmReader::open(input, &bytes, &base)?;
            r.write_to(&mut sink, &|_| {})?;
            Ok(format!(
                "z4ai model delta against {} (base digest ok): {} FULL, {} DELTA, {} COPY records, {} bytes -> {} bytes",
                base.path().display(),
                s.full.records,
                s.delta.records,
                s.copy.records,
                bytes.len(),
                sink.0
            ))
        }
        DeltaKind::Z4dl => {
            let r = Z4dlReader::open(input, &bytes, &base)?;
            r.write_to(&mut sink)?;
            Ok(format!(
                "z4ai XOR delta against {} (reference digest ok): {} bytes -> {} bytes",
                base.path().display(),
                bytes.len(),
                sink.0
            ))
        }
    }
}

struct CountingSink(u64);

impl std::io::Write for CountingSink {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0 += buf.len() as u64;
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// `ckptfs info DELTA [--base BASE]`: record counts and sizes by kind,
/// the target's size and, with a base, whether it is the right one.
/// Prints the human form unless `json`; returns the JSON form.
pub fn info(
    input: &Path,
    kind: DeltaKind,
    base: Option<&Path>,
    json: bool,
) -> Result<serde_json::Value> {
    let bytes = map(input)?;
    // With a base: "matches", or the reason it does not (structure errors
    // of the delta itself are errors of `info`).
    let base_status = |check: &dyn Fn(&Base) -> std::result::Result<(), DeltaError>| -> Result<Option<(String, bool, String)>> {
        let Some(p) = base else { return Ok(None) };
        let b = Base::open(p)?;
        Ok(Some(match check(&b) {
            Ok(()) => (p.display().to_string(), true, "matches".to_string()),
            Err(e @ (DeltaError::WrongBase { .. } | DeltaError::Base { .. })) => {
                (p.display().to_string(), false, e.to_string())
            }
            Err(e) => return Err(e.into()),
        }))
    };
    let v = match kind {
        DeltaKind::Z4dm => {
            let s = summarize_z4dm(input, &bytes)?;
            let st = base_status(&|b| Z4dmReader::open(input, &bytes, b).map(|_| ()))?;
            let mut v = serde_json::json!({
                "file": input.display().to_string(),
                "format": "z4ai-z4dm-v1",
                "stored_bytes": bytes.len(),
                "target_bytes": s.target_len,
                "header_bytes": s.header_len,
                "data_bytes": s.data_len,
                "base_digest_blake2b8": s.base_digest,
                "records": {"FULL": s.full, "DELTA": s.delta, "COPY": s.copy},
            });
            add_base(&mut v, st);
            if !json {
                println!("{}: z4ai model delta (Z4DM v1)", input.display());
                println!(
                    "  target       {} bytes (header {}, data {})",
                    s.target_len, s.header_len, s.data_len
                );
                println!(
                    "  stored       {} bytes ({:.2}x)",
                    bytes.len(),
                    s.target_len as f64 / bytes.len().max(1) as f64
                );
                for (name, k) in [("FULL", &s.full), ("DELTA", &s.delta), ("COPY", &s.copy)] {
                    println!(
                        "  {name:<6} {:>7} records, {:>14} target bytes, {:>14} stored bytes",
                        k.records, k.target_bytes, k.stored_bytes
                    );
                }
                println!(
                    "  base digest  BLAKE2b-8 {} of the base's data buffer",
                    s.base_digest
                );
            }
            v
        }
        DeltaKind::Z4dl => {
            let dl = Z4dl::parse(&bytes).with_context(|| input.display().to_string())?;
            let frame = dl
                .inner()
                .map(|f| f.kind_tag())
                .unwrap_or_else(|_| "-".into());
            let st = base_status(&|b| Z4dlReader::open(input, &bytes, b).map(|_| ()))?;
            let mut v = serde_json::json!({
                "file": input.display().to_string(),
                "format": "z4ai-z4dl-v2",
                "stored_bytes": bytes.len(),
                "target_bytes": dl.ref_len,
                "frame": frame,
                "reference_digest_blake2b16": hex(&dl.ref_digest),
            });
            add_base(&mut v, st);
            if !json {
                println!("{}: z4ai XOR delta (Z4DL v2)", input.display());
                println!(
                    "  target       {} bytes (= reference), stored {} bytes, inner frame {frame}",
                    dl.ref_len,
                    bytes.len()
                );
                println!("  reference    BLAKE2b-16 {}", hex(&dl.ref_digest));
            }
            v
        }
    };
    if let (false, Some(b)) = (json, v.get("base")) {
        println!(
            "  base         {}: {}",
            b["path"].as_str().unwrap_or_default(),
            b["status"].as_str().unwrap_or_default()
        );
    }
    Ok(v)
}

fn add_base(v: &mut serde_json::Value, st: Option<(String, bool, String)>) {
    if let Some((path, ok, status)) = st {
        v["base"] = serde_json::json!({"path": path, "matches": ok, "status": status});
    }
}
