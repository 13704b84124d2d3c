//! `ckptfs info`: what an archive holds and how well it is compressed.
//! For a path inside a ckptfs mount, the `user.ckptfs.*` attributes the
//! mount answers for it (by name: the mount does not list them, so copies
//! do not carry them).

use super::{open_input, Global, Input, Result};
use crate::archive::{ArchiveView, ZstnArchive};
use crate::codec::plane::method_name;
use crate::format::frame::Frame;
use crate::format::zstn::{Layout, RecordKind};
use crate::model::{Model, ModelError};
use anyhow::Context as _;
use serde::Serialize;
use std::collections::BTreeMap;
use std::path::Path;
use std::process::ExitCode;

#[derive(Debug, Serialize)]
pub struct TensorInfo {
    pub name: String,
    pub dtype: String,
    pub shape: Vec<u64>,
    pub raw_bytes: u64,
    pub stored_bytes: u64,
    pub ratio: f64,
    pub record: &'static str,
    pub frame: String,
    pub methods: Vec<&'static str>,
    pub blocks: usize,
}

#[derive(Debug, Serialize)]
pub struct FileInfo {
    pub file: String,
    pub format: &'static str,
    pub tensors: usize,
    pub raw_bytes: u64,
    pub stored_bytes: u64,
    pub ratio: f64,
    pub checksums: bool,
    /// Which checksums and who added them: "ckx1 (ckptfs-written)",
    /// "ckx1 (sealed)", or "none (...)".
    pub checksum_kind: String,
    pub dtypes: BTreeMap<String, usize>,
    pub frame_kinds: BTreeMap<String, usize>,
    pub plane_methods: BTreeMap<String, usize>,
    pub records: BTreeMap<String, usize>,
    pub tensor_list: Vec<TensorInfo>,
    /// Why the header is not strict safetensors, when it is not (z4ai
    /// writes some such files; they still decode exactly).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub header_note: Option<String>,
}

/// dtype and shape of each entry of a header that is not strict
/// safetensors, as far as they can be read (best effort, for display).
fn loose_entries(raw: &[u8]) -> BTreeMap<String, (String, Vec<u64>)> {
    let Ok(serde_json::Value::Object(obj)) = serde_json::from_slice(raw) else {
        return BTreeMap::new();
    };
    obj.into_iter()
        .filter(|(k, _)| k != "__metadata__")
        .map(|(k, v)| {
            let dtype = v["dtype"].as_str().unwrap_or("?").to_string();
            let shape = v["shape"]
                .as_array()
                .map(|a| a.iter().filter_map(|d| d.as_u64()).collect())
                .unwrap_or_default();
            (k, (dtype, shape))
        })
        .collect()
}

fn ratio(raw: u64, stored: u64) -> f64 {
    if stored == 0 {
        1.0
    } else {
        raw as f64 / stored as f64
    }
}

fn frame_desc(f: &Frame<'_>) -> (String, Vec<&'static str>) {
    (
        f.kind_tag(),
        f.plane_methods().into_iter().map(method_name).collect(),
    )
}

/// How a `.zstn` is checksummed, as `info` reports it.
pub fn checksum_kind(a: &ZstnArchive) -> &'static str {
    match a.extension() {
        Some(e) if e.sealed() => "ckx1 (sealed)",
        Some(_) => "ckx1 (ckptfs-written)",
        None => "none (z4ai-written; `ckptfs seal` adds checksums)",
    }
}

pub fn archive_info(a: &ZstnArchive) -> crate::archive::Result<FileInfo> {
    let mut info = FileInfo {
        file: super::s3::shown(a.path()),
        format: "ZSTN v3",
        tensors: 0,
        raw_bytes: a.len(),
        stored_bytes: a.stored_len(),
        ratio: ratio(a.len(), a.stored_len()),
        checksums: a.extension().is_some(),
        checksum_kind: checksum_kind(a).into(),
        dtypes: BTreeMap::new(),
        frame_kinds: BTreeMap::new(),
        plane_methods: BTreeMap::new(),
        records: BTreeMap::new(),
        tensor_list: Vec::new(),
        header_note: a
            .header_error()
            .map(|e| {
                format!("the header is not strict safetensors ({e}); the file decodes exactly")
            })
            .or_else(|| {
                let h = a.header()?;
                let e = h.validate(a.container().data_len).err()?;
                Some(format!("not strict safetensors: {e}"))
            }),
    };
    let loose = match a.header() {
        Some(h) => {
            info.tensors = h.tensors.len();
            for t in &h.tensors {
                *info.dtypes.entry(t.dtype.clone()).or_default() += 1;
            }
            BTreeMap::new()
        }
        None => {
            let loose = loose_entries(a.header_bytes());
            info.tensors = a.records().len().max(loose.len());
            for (dtype, _) in loose.values() {
                *info.dtypes.entry(dtype.clone()).or_default() += 1;
            }
            loose
        }
    };
    let count = |info: &mut FileInfo, f: &Frame<'_>| {
        *info.frame_kinds.entry(f.kind_tag()).or_default() += 1;
        for m in f.plane_methods() {
            *info
                .plane_methods
                .entry(method_name(m).to_string())
                .or_default() += 1;
        }
    };
    match &a.container().layout {
        Layout::Opaque { frame_len, .. } => {
            let f = a.frame(0)?;
            count(&mut info, &f);
            *info.records.entry("opaque".into()).or_default() += 1;
            let (frame, methods) = frame_desc(&f);
            info.tensor_list.push(TensorInfo {
                name: "<whole data buffer>".into(),
                dtype: "-".into(),
                shape: vec![],
                raw_bytes: a.container().data_len,
                stored_bytes: *frame_len,
                ratio: ratio(a.container().data_len, *frame_len),
                record: "OPAQUE",
                frame,
                methods,
                blocks: 1,
            });
        }
        Layout::Indexed { records, .. } => {
            // One map, not a search of the header per record.
            let entries: std::collections::HashMap<&str, &crate::format::safetensors::TensorEntry> =
                a.header()
                    .map(|h| h.tensors.iter().map(|t| (t.name.as_str(), t)).collect())
                    .unwrap_or_default();
            for (i, r) in records.iter().enumerate() {
                let name = a.record_name(i);
                let (dtype, shape) = match entries.get(name) {
                    Some(e) => (e.dtype.clone(), e.shape.clone()),
                    None => loose.get(name).cloned().unwrap_or(("?".into(), vec![])),
                };
                let unit = a.unit_of_record(i);
                let f = a.frame(unit)?;
                let (frame, methods) = frame_desc(&f);
                let (record, stored) = match r.kind {
                    RecordKind::Frame { len, .. } => {
                        count(&mut info, &f);
                        ("FRAME", len)
                    }
                    RecordKind::Ref(_) => ("REF", 0),
                };
                *info.records.entry(record.into()).or_default() += 1;
                info.tensor_list.push(TensorInfo {
                    name: a.record_name(i).to_string(),
                    dtype,
                    shape,
                    raw_bytes: r.len(),
                    stored_bytes: stored,
                    ratio: ratio(r.len(), stored),
                    record,
                    frame,
                    methods,
                    blocks: a.grid(unit)?.blocks(),
                });
            }
        }
    }
    Ok(info)
}

fn frame_info(path: &std::path::Path, bytes: &[u8]) -> Result<FileInfo> {
    let f = Frame::parse(bytes).with_context(|| path.display().to_string())?;
    let raw = f.decoded_len();
    let (frame, methods) = frame_desc(&f);
    let mut info = FileInfo {
        file: super::s3::shown(path),
        format: "z4ai frame",
        tensors: 1,
        raw_bytes: raw,
        stored_bytes: bytes.len() as u64,
        ratio: ratio(raw, bytes.len() as u64),
        checksums: false,
        checksum_kind: "none (bare z4ai frame)".into(),
        dtypes: BTreeMap::new(),
        frame_kinds: BTreeMap::from([(frame.clone(), 1)]),
        plane_methods: BTreeMap::new(),
        records: BTreeMap::new(),
        tensor_list: vec![],
        header_note: None,
    };
    for m in &methods {
        *info.plane_methods.entry(m.to_string()).or_default() += 1;
    }
    info.tensor_list.push(TensorInfo {
        name: "<frame>".into(),
        dtype: "-".into(),
        shape: vec![],
        raw_bytes: raw,
        stored_bytes: bytes.len() as u64,
        ratio: info.ratio,
        record: "FRAME",
        frame,
        methods,
        blocks: 1,
    });
    Ok(info)
}

/// Whether `path` is named as safetensors (then its header's error is the
/// one to report, not that it is no archive).
fn looks_safetensors(path: &Path) -> bool {
    path.extension().is_some_and(|e| e == "safetensors")
}

/// What `list` and `export` read as a model and `info` summarises without
/// an archive: a `.safetensors` file or a model directory (whose `.zstn`
/// shards count as the `.safetensors` they hold: stored bytes are the
/// bytes on disk).
fn model_info(path: &Path) -> Result<FileInfo> {
    let m = Model::open(path)?;
    let dir = path.is_dir();
    let mut info = FileInfo {
        file: path.display().to_string(),
        format: if dir {
            "model directory"
        } else {
            "safetensors"
        },
        tensors: m.tensors().len(),
        raw_bytes: m.files().iter().map(|f| f.len).sum(),
        stored_bytes: disk_bytes(path).with_context(|| path.display().to_string())?,
        ratio: 1.0,
        checksums: false,
        checksum_kind: "none (plain files)".into(),
        dtypes: BTreeMap::new(),
        frame_kinds: BTreeMap::new(),
        plane_methods: BTreeMap::new(),
        records: BTreeMap::new(),
        tensor_list: Vec::new(),
        header_note: dir.then(|| {
            format!(
                "{}; `ckptfs info` on an archive in it shows its compression",
                super::plural(m.files().len(), "file", "files")
            )
        }),
    };
    info.ratio = ratio(info.raw_bytes, info.stored_bytes);
    for t in m.tensors() {
        *info.dtypes.entry(t.dtype.clone()).or_default() += 1;
        info.tensor_list.push(TensorInfo {
            name: if dir {
                format!("{}: {}", m.files()[t.file].path, t.name)
            } else {
                t.name.clone()
            },
            dtype: t.dtype.clone(),
            shape: t.shape.clone(),
            raw_bytes: t.len,
            stored_bytes: t.len,
            ratio: 1.0,
            record: "PLAIN",
            frame: "-".into(),
            methods: Vec::new(),
            blocks: 0,
        });
    }
    Ok(info)
}

/// The bytes of the regular files at or under `path` (symlinks not
/// followed).
fn disk_bytes(path: &Path) -> std::io::Result<u64> {
    let m = path.symlink_metadata()?;
    if !m.is_dir() {
        return Ok(if m.is_file() { m.len() } else { 0 });
    }
    let mut n = 0;
    for e in std::fs::read_dir(path)? {
        n += disk_bytes(&e?.path())?;
    }
    Ok(n)
}

fn hist(m: &BTreeMap<String, usize>) -> String {
    m.iter()
        .map(|(k, v)| format!("{k} ×{v}"))
        .collect::<Vec<_>>()
        .join(", ")
}

fn print_human(i: &FileInfo, per_tensor: bool) {
    println!("{}", i.file);
    println!("  format        {}", i.format);
    println!("  checksums     {}", i.checksum_kind);
    println!("  tensors       {}", i.tensors);
    println!("  dtypes        {}", hist(&i.dtypes));
    println!("  raw bytes     {}", i.raw_bytes);
    println!("  stored bytes  {}", i.stored_bytes);
    println!("  ratio         {:.4}", i.ratio);
    println!("  records       {}", hist(&i.records));
    println!("  frame kinds   {}", hist(&i.frame_kinds));
    println!("  plane methods {}", hist(&i.plane_methods));
    if let Some(n) = &i.header_note {
        println!("  note          {n}");
    }
    if per_tensor {
        println!(
            "  {:<48} {:>8} {:>14} {:>14} {:>7} {:>6}  frame / planes",
            "tensor", "dtype", "raw", "stored", "ratio", "blocks"
        );
        for t in &i.tensor_list {
            println!(
                "  {:<48} {:>8} {:>14} {:>14} {:>7.3} {:>6}  {}{} [{}]",
                t.name,
                t.dtype,
                t.raw_bytes,
                t.stored_bytes,
                t.ratio,
                t.blocks,
                if t.record == "REF" { "REF -> " } else { "" },
                t.frame,
                t.methods.join(",")
            );
        }
    }
}

pub fn run(_g: Global, a: crate::cli::InfoArgs) -> Result<ExitCode> {
    let mut infos = Vec::new();
    // BLAZE-X archives and z4ai deltas have their own fields.
    let mut blazex_json = Vec::new();
    let mut failed = false;
    for path in &a.files {
        if super::mount::in_ckptfs_mount(path) {
            print_mounted(path, a.json);
            continue;
        }
        if let Some(kind) = super::z4delta::peek(path) {
            match super::z4delta::info(path, kind, a.base.as_deref(), a.json) {
                Ok(v) => blazex_json.push(v),
                Err(e) => {
                    eprintln!("ckptfs: {}", super::s3::named(&super::one_line(&*e)));
                    failed = true;
                }
            }
            continue;
        }
        if a.base.is_some() {
            eprintln!(
                "ckptfs: {}",
                super::s3::named(&super::z4delta::base_not_applicable(path).to_string())
            );
            failed = true;
            continue;
        }
        if super::blz::is_blz(path) {
            if let Err(e) = super::blz::info(path, a.json) {
                eprintln!("ckptfs: {}", super::s3::named(&super::one_line(&*e)));
                failed = true;
            }
            continue;
        }
        if path.is_dir() {
            match model_info(path) {
                Ok(i) => infos.push(i),
                Err(e) => {
                    eprintln!("ckptfs: {}", super::one_line(&*e));
                    failed = true;
                }
            }
            continue;
        }
        let r = match open_input(path) {
            // .blz went above; the container-level details are a .zstn's.
            Ok(Input::Archive(ar)) => {
                let any = &*ar as &dyn std::any::Any;
                if let Some(b) = any.downcast_ref::<crate::archive::BlazexArchive>() {
                    if a.json {
                        blazex_json.push(super::blazex::info_json(b));
                    } else {
                        super::blazex::print_info(b, !a.summary);
                    }
                    continue;
                }
                if let Some(d) = any.downcast_ref::<crate::archive::DeltaArchive>() {
                    let (c, dl, f) = d.counts();
                    let v = serde_json::json!({
                        "file": super::s3::shown(path),
                        "format": "ckptfs-delta-v1",
                        "base": d.base_rel(),
                        "chain_depth": d.depth(),
                        "copy": c, "delta": dl, "full": f,
                        "size": d.logical_len(0),
                        "stored": d.stored_len(),
                    });
                    if a.json {
                        blazex_json.push(v);
                    } else {
                        println!(
                            "{}: ckptfs delta (chain depth {}) against {}: {} COPY, {dl} DELTA, {f} FULL tensors, {} -> {} bytes, ratio {:.4}",
                            super::s3::shown(path),
                            d.depth(),
                            d.base_rel(),
                            c,
                            d.logical_len(0),
                            d.stored_len(),
                            d.logical_len(0) as f64 / d.stored_len().max(1) as f64
                        );
                    }
                    continue;
                }
                match any.downcast_ref() {
                    Some(z) => archive_info(z).map_err(|e| e.into()),
                    None => Err(anyhow::anyhow!(
                        "{}: not a ZSTN archive",
                        super::s3::shown(path)
                    )),
                }
            }
            Ok(Input::Frame(map)) => frame_info(path, &map),
            // Not an archive: a `.safetensors` file, as `list` reads it.
            Err(e) => model_info(path).map_err(|me| match me.downcast_ref::<ModelError>() {
                Some(ModelError::Header { .. }) if !looks_safetensors(path) => e,
                _ => me,
            }),
        };
        match r {
            Ok(i) => infos.push(i),
            Err(e) => {
                // A ckptfs delta whose base cannot be opened: what its own
                // head and trailer say, then why it cannot be read.
                if let Some(v) = delta_without_base(path) {
                    if a.json {
                        blazex_json.push(v);
                    } else {
                        println!(
                            "{}: ckptfs delta (chain depth {}) against {} (not readable): {} -> {} bytes",
                            path.display(),
                            v["chain_depth"],
                            v["base"].as_str().unwrap_or_default(),
                            v["size"],
                            v["stored"]
                        );
                    }
                }
                eprintln!("ckptfs: {}", super::s3::named(&super::one_line(&*e)));
                failed = true;
            }
        }
    }
    if a.json {
        let mut all: Vec<serde_json::Value> = infos
            .iter()
            .map(serde_json::to_value)
            .collect::<std::result::Result<_, _>>()?;
        all.extend(blazex_json);
        println!("{}", serde_json::to_string_pretty(&all)?);
    } else {
        for i in &infos {
            print_human(i, !a.summary);
        }
    }
    Ok(if failed {
        ExitCode::from(1)
    } else {
        ExitCode::SUCCESS
    })
}

/// The `user.ckptfs.*` attributes a mount answers for `path` (asked by
/// name), printed as `name value` lines or one JSON object.
fn print_mounted(path: &std::path::Path, json: bool) {
    use crate::fs::{XATTR_CHECKSUMS, XATTR_ERROR, XATTR_FORMAT, XATTR_RATIO, XATTR_STORED_SIZE};
    let attrs: BTreeMap<&str, String> = [
        XATTR_FORMAT,
        XATTR_STORED_SIZE,
        XATTR_RATIO,
        XATTR_CHECKSUMS,
        XATTR_ERROR,
    ]
    .into_iter()
    .filter_map(|n| {
        let v = getxattr(path, n).ok()?;
        Some((n, String::from_utf8_lossy(&v).into_owned()))
    })
    .collect();
    if json {
        let v = serde_json::json!({ "file": super::s3::shown(path), "xattrs": attrs });
        println!("{v}");
        return;
    }
    println!("{}", path.display());
    if attrs.is_empty() {
        println!("  (in a ckptfs mount; not an archive: no user.ckptfs.* attributes)");
    }
    for (n, v) in &attrs {
        println!("  {n:<24}{v}");
    }
}

/// The value of extended attribute `name` of `path` (followed).
fn getxattr(path: &std::path::Path, name: &str) -> std::io::Result<Vec<u8>> {
    use std::os::unix::ffi::OsStrExt;
    let invalid = |_| std::io::Error::from_raw_os_error(libc::EINVAL);
    let p = std::ffi::CString::new(path.as_os_str().as_bytes()).map_err(invalid)?;
    let n = std::ffi::CString::new(name).map_err(invalid)?;
    let mut buf = vec![0u8; 4096];
    // SAFETY: NUL-terminated path and name; `buf` is writable for its length.
    let r = unsafe {
        libc::getxattr(
            p.as_ptr(),
            n.as_ptr(),
            buf.as_mut_ptr() as *mut libc::c_void,
            buf.len(),
        )
    };
    if r < 0 {
        return Err(std::io::Error::last_os_error());
    }
    buf.truncate(r as usize);
    Ok(buf)
}

/// What a ckptfs delta (`Z4DM` with a `CKD1` trailer) says of itself without
/// its base: the base's recorded path, chain depth, presented and stored
/// sizes. None for any other file.
fn delta_without_base(path: &std::path::Path) -> Option<serde_json::Value> {
    let f = std::fs::File::open(path).ok()?;
    let size = crate::archive::delta::presented_len_of_head(&f)?;
    // SAFETY: a read-only private map of a file this command only reads.
    let map = unsafe { memmap2::Mmap::map(&f) }.ok()?;
    let t = crate::format::delta::Trailer::find(&map).ok()??;
    Some(serde_json::json!({
        "file": path.display().to_string(),
        "format": "ckptfs-delta-v1",
        "base": t.base_path,
        "chain_depth": t.depth,
        "size": size,
        "stored": map.len(),
        "error": "the base cannot be opened",
    }))
}
