//! Command-line types (clap derive). Doc comments here are the `--help` text.

use clap::{CommandFactory, Parser, Subcommand};
use std::ffi::OsString;
use std::path::PathBuf;

/// The command line, with mount(8)'s form read as `mount`: fuse3's
/// `mount.fuse3` runs `ckptfs STORE MNT -o OPTIONS` for a `fuse.ckptfs`
/// line of /etc/fstab, which is `ckptfs mount STORE MNT -o OPTIONS`. Any
/// first argument that is neither a subcommand nor a flag starts that form.
pub fn with_mount_helper_form(args: impl IntoIterator<Item = OsString>) -> Vec<OsString> {
    let mut v: Vec<OsString> = args.into_iter().collect();
    let helper_form = v.len() >= 3
        && v[1].to_str().is_none_or(|first| {
            !first.starts_with('-')
                && first != "help"
                && !Cli::command()
                    .get_subcommands()
                    .any(|c| c.get_name() == first)
        });
    if helper_form {
        v.insert(1, "mount".into());
        v.insert(2, "--mount-helper".into());
    }
    v
}

/// ckptfs: compressed model checkpoints, served as ordinary safetensors files.
#[derive(Debug, Parser)]
#[command(name = "ckptfs", version, about, propagate_version = true)]
pub struct Cli {
    /// Worker threads for parallel work (default: all cores).
    #[arg(long, global = true, value_name = "N")]
    pub threads: Option<usize>,

    /// Never show progress bars.
    #[arg(long, short, global = true)]
    pub quiet: bool,

    #[command(subcommand)]
    pub command: Command,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Compress a .safetensors file into a .zstn, a model directory into a store (-r), or a model directory into one .blz archive (-o NAME.blz).
    Pack(PackArgs),
    /// Restore the original .safetensors from a .zstn (a raw file from a .z4ai frame, a directory from a .blz).
    Unpack(UnpackArgs),
    /// Summarise archives: tensors, dtypes, sizes, ratio, frame kinds and plane methods.
    Info(InfoArgs),
    /// Decode everything and check all structure and checksums; one verdict line per file.
    Verify(VerifyArgs),
    /// Add ckptfs's checksums to z4ai-written .zstn files, in place: frames untouched, every block decoded and checked first; z4ai still reads them.
    Seal(SealArgs),
    /// List the tensors of a model (any archive, a .safetensors file or a model directory) with dtype, shape and size.
    List(ListArgs),
    /// Write chosen tensors of a model (any archive, a .safetensors file or a model directory) as raw .bin files or one .safetensors, decoding only those.
    Extract(ExtractArgs),
    /// Export a model (any archive, a .safetensors file or a model directory) as a safetensors directory, PyTorch-loadable raw files, raw .bin files or GGUF, optionally casting float tensors.
    Export(ExportArgs),
    /// Write a .blzdiff patch (BLAZE-X file format 2, open encodings) that turns BASE into TARGET (each a BLAZE-X .blz, a ckptfs .blz or a model directory).
    Diff(DiffArgs),
    /// Apply a BLAZE-X .blzdiff patch (file format 1 or 2) to BASE, writing the TARGET .blz; every tensor is checked against the patch's xxh3 before anything is written.
    Apply(ApplyArgs),
    /// Mount a store: .zstn archives appear as .safetensors files, .blz archives as directories; writable unless --read-only.
    Mount(Box<MountArgs>),
    /// Unmount a ckptfs mount.
    Umount(UmountArgs),
    /// Print a mount's counters: bytes served, blocks decoded, cache, commits, errors, S3 traffic.
    Stats(StatsArgs),
    /// Run a command (a backup of STORE) while the mount's daemon commits
    /// nothing to STORE: `ckptfs hold STORE -- rsync ...`.
    Hold(HoldArgs),
    /// Convert an unmounted store to the layout of `mount --delta auto`: in each family of checkpoints the newest standalone, older ones reverse deltas against their successor, a standalone keyframe every 4 (forward deltas made standalone first).
    Repack(RepackArgs),
}

#[derive(Debug, clap::Args)]
pub struct UnpackArgs {
    /// The archive to unpack.
    pub input: PathBuf,
    /// Output path (default: the input name without .zstn, ending in .safetensors; for a .blz, the name without .blz); `-` writes a one-file archive to standard output.
    #[arg(short, long)]
    pub output: Option<PathBuf>,
    /// Replace existing output files.
    #[arg(short, long)]
    pub force: bool,
    /// For a z4ai delta (.z4dm, .z4dl): the checkpoint it was built against (a .safetensors, a .zstn or any archive ckptfs reads presenting one file). Its digest is checked before anything is written.
    #[arg(long, value_name = "BASE")]
    pub base: Option<PathBuf>,
}

#[derive(Debug, clap::Args)]
pub struct InfoArgs {
    #[arg(required = true)]
    pub files: Vec<PathBuf>,
    /// Machine-readable JSON output.
    #[arg(long)]
    pub json: bool,
    /// Only the summary, without the per-tensor table.
    #[arg(long)]
    pub summary: bool,
    /// For z4ai deltas (.z4dm, .z4dl): also say whether BASE is the checkpoint they were built against.
    #[arg(long, value_name = "BASE")]
    pub base: Option<PathBuf>,
}

#[derive(Debug, clap::Args)]
pub struct DiffArgs {
    /// The base: a BLAZE-X .blz, a ckptfs .blz or a model directory.
    pub base: PathBuf,
    /// The target: a BLAZE-X .blz, a ckptfs .blz or a model directory.
    pub target: PathBuf,
    /// The patch to write.
    #[arg(short, long)]
    pub output: PathBuf,
    /// Replace an existing output.
    #[arg(short, long)]
    pub force: bool,
    /// Blob encodings: `open` (a patch blazex's apply accepts), `ckptfs`
    /// (also ckptfs's codec wherever it is smaller; only ckptfs applies it),
    /// `auto` (ckptfs when TARGET is a ckptfs .blz, else open).
    #[arg(long, value_enum, default_value_t = PatchEncodings::Auto)]
    pub encodings: PatchEncodings,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum PatchEncodings {
    Auto,
    Open,
    Ckptfs,
}

#[derive(Debug, clap::Args)]
pub struct ApplyArgs {
    /// The base: a BLAZE-X .blz, a ckptfs .blz or a model directory.
    pub base: PathBuf,
    /// The .blzdiff patch.
    pub patch: PathBuf,
    /// The target .blz to write.
    #[arg(short, long)]
    pub output: PathBuf,
    /// Replace an existing output.
    #[arg(short, long)]
    pub force: bool,
}

#[derive(Debug, clap::Args)]
pub struct VerifyArgs {
    /// Archives to verify fully, or store directories: in a store, every archive (.zstn, .zsame, .z4dm, .blz) is verified in parallel, then every delta (.z4dm) relation is checked (base present inside the store, content digest as recorded, chain depth within bounds); exit 1 if any fails.
    #[arg(required = true)]
    pub files: Vec<PathBuf>,
    /// For z4ai deltas (.z4dm, .z4dl): the checkpoint they were built against; each delta is decoded against it and every digest checked.
    #[arg(long, value_name = "BASE")]
    pub base: Option<PathBuf>,
}

#[derive(Debug, clap::Args)]
pub struct SealArgs {
    /// The .zstn files (or BLAZE-X .blz archives: a header digest) to seal (already checksummed ones are left as they are).
    #[arg(required = true)]
    pub files: Vec<PathBuf>,
    /// The sha256 (64 hex digits) the presented .safetensors must have; on a mismatch nothing is written (one FILE only).
    #[arg(long, value_name = "HEX", value_parser = parse_sha256)]
    pub sha256: Option<[u8; 32]>,
    /// Seal a file that has other hard links (they keep the unsealed file).
    #[arg(short, long)]
    pub force: bool,
}

fn parse_sha256(s: &str) -> Result<[u8; 32], String> {
    crate::pack::seal::parse_sha256(s)
}

#[derive(Debug, clap::Args)]
pub struct PackArgs {
    /// A .safetensors file, or with -r a model directory.
    pub input: PathBuf,
    /// Output .zstn (default: INPUT with .safetensors replaced by .zstn); with -r the store directory; a name ending in .blz packs the directory INPUT into one archive.
    #[arg(short, long)]
    pub output: Option<PathBuf>,
    /// For .blz: store tensor bytes raw (uncompressed little-endian, the BLAZE-X layout).
    #[arg(long)]
    pub raw: bool,
    /// For .blz: which archive to write. `ckptfs` (default): ckptfs's compressed .blz, the whole directory byte for byte. `blazex`: the BLAZE-X tool's uncompressed layout (model tensors, config, tokenizer and its sidecars only), for blazex users.
    #[arg(long, value_enum, default_value_t = BlzFormat::Ckptfs)]
    pub format: BlzFormat,
    /// Pack a whole directory tree: every .safetensors becomes a .zstn, every other file is copied.
    #[arg(short, long)]
    pub recursive: bool,
    /// Store INPUT as a delta against BASE (a .safetensors, a .zstn or a delta): tensors matched by name, dtype and byte length (as z4ai does); unchanged ones cost nothing, changed ones store their XOR with the base or themselves, whichever is smaller. Output: a .z4dm (default INPUT with .safetensors replaced by .z4dm) that records BASE's path relative to it; z4ai's model_delta.decompress reads it.
    #[arg(long, value_name = "BASE", conflicts_with_all = ["recursive", "standalone"])]
    pub base: Option<PathBuf>,
    /// Turn a delta (.z4dm) into a standalone .zstn (default: INPUT with .z4dm replaced by .zstn).
    #[arg(long, conflicts_with = "recursive")]
    pub standalone: bool,
    /// zstd level for opaque (integer, bool, fp8) tensors.
    #[arg(long, default_value_t = 3, value_parser = clap::value_parser!(i32).range(1..=19))]
    pub level: i32,
    /// Frame layouts to write. `ckptfs` (default): float tensors in split-float frames where they pay (faster to decode; z4ai 0.2.0 cannot read them). `z4ai`: only frames z4ai 0.2.0 reads. INPUT may be a .zstn to repack it either way.
    #[arg(long, value_enum, default_value_t = CompatArg::Ckptfs)]
    pub compat: CompatArg,
    /// Replace existing output files.
    #[arg(short, long)]
    pub force: bool,
}

/// `--compat`: which frame layouts a writer may use.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum CompatArg {
    Ckptfs,
    Z4ai,
}

impl From<CompatArg> for crate::pack::Compat {
    fn from(c: CompatArg) -> Self {
        match c {
            CompatArg::Ckptfs => crate::pack::Compat::Ckptfs,
            CompatArg::Z4ai => crate::pack::Compat::Z4ai,
        }
    }
}

/// The `.blz` layouts `pack` writes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum BlzFormat {
    Ckptfs,
    Blazex,
}

#[derive(Debug, clap::Args)]
pub struct ListArgs {
    /// An archive (.zstn, .blz), a .safetensors file or a model directory.
    pub input: PathBuf,
    /// Only tensors whose name contains this substring.
    #[arg(long, value_name = "SUBSTRING")]
    pub filter: Option<String>,
    /// Machine-readable JSON output (name, dtype, shape, bytes, file).
    #[arg(long)]
    pub json: bool,
}

#[derive(Debug, clap::Args)]
pub struct ExtractArgs {
    /// An archive (.zstn, .blz), a .safetensors file or a model directory.
    pub input: PathBuf,
    /// Tensor names (FILE:NAME when the name is in several shards).
    #[arg(long = "tensor", value_name = "NAME", required = true, num_args = 1..)]
    pub tensors: Vec<String>,
    /// Output directory.
    #[arg(short, long)]
    pub output: PathBuf,
    /// Write one .safetensors file (named after the archive) instead of a .bin per tensor.
    #[arg(long)]
    pub safetensors: bool,
    /// Replace existing output files.
    #[arg(short, long)]
    pub force: bool,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum ExportTarget {
    /// A model directory: shards kept, index json, other files copied byte for byte.
    Safetensors,
    /// tensors/NAME.bin (raw little-endian), manifest.json and load.py.
    Pytorch,
    /// NAME.bin per tensor (raw little-endian) and index.json.
    Raw,
    /// One GGUF v3 file for llama.cpp.
    Gguf,
}

/// How `mount --delta` stores committed files.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum DeltaMode {
    /// A `.safetensors` written into the mount is stored as a delta (`X.z4dm`) against a candidate base when that is at least 20% smaller (doc/SEMANTICS.md).
    Auto,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum ExportCast {
    F32,
    F16,
    Bf16,
    #[value(name = "q8_0")]
    Q8_0,
    #[value(name = "q4_0")]
    Q4_0,
    #[value(name = "q4_k")]
    Q4K,
}

#[derive(Debug, clap::Args)]
pub struct ExportArgs {
    /// An archive (.zstn, .blz), a .safetensors file or a model directory.
    pub input: PathBuf,
    /// Output directory (a file for --to gguf).
    #[arg(short, long)]
    pub output: PathBuf,
    /// What to write.
    #[arg(long = "to", value_enum)]
    pub target: ExportTarget,
    /// Cast float tensors (F64/F32/F16/BF16) to this type, rounding to nearest-even; q8_0, q4_0, q4_k only with --to gguf.
    #[arg(long, value_enum)]
    pub cast: Option<ExportCast>,
    /// Replace an existing output.
    #[arg(short, long)]
    pub force: bool,
}

#[derive(Debug, clap::Args)]
pub struct MountArgs {
    /// The store directory (archives and any other files), or an S3 store s3://BUCKET/PREFIX (writable too: files written are uploaded after close).
    pub store: PathBuf,
    /// Where to present it.
    pub mountpoint: PathBuf,
    /// Stay attached to the terminal (for systemd and debugging).
    #[arg(short, long)]
    pub foreground: bool,
    /// Memory for decoded blocks, e.g. 2G or 512M (default: 256M).
    #[arg(long, value_name = "SIZE")]
    pub cache_size: Option<String>,
    /// Let other users access the mount (needs user_allow_other in /etc/fuse.conf).
    #[arg(long)]
    pub allow_other: bool,
    /// Mount even if MOUNTPOINT is not empty (FUSE's `-o nonempty`): what it
    /// holds is hidden until the unmount. Without it a non-empty MOUNTPOINT
    /// is refused.
    #[arg(long)]
    pub allow_nonempty: bool,
    /// Refuse every change (EROFS) and leave STORE untouched. By default the
    /// mount is writable: `.safetensors` files written into it are staged
    /// and recompressed to `.zstn` after they are closed.
    #[arg(long)]
    pub read_only: bool,
    /// Frame layouts the write-back uses (as `pack --compat`): `z4ai` writes only frames z4ai 0.2.0 reads.
    #[arg(long, value_enum, default_value_t = CompatArg::Ckptfs)]
    pub compat: CompatArg,
    /// Serve only archives with checksums (ckptfs-written, or sealed with `ckptfs seal`); a z4ai-written .zstn is listed, but opening it fails (EIO).
    #[arg(long)]
    pub require_checksums: bool,
    /// error, warn, info, debug or trace (or a RUST_LOG filter); RUST_LOG also works.
    #[arg(long, value_name = "LEVEL")]
    pub log_level: Option<String>,
    /// Log file of the background daemon, or `syslog` for the system log (journald) (default: ~/.local/state/ckptfs/mount-<mountpoint>.log; syslog when mount(8) runs ckptfs from /etc/fstab).
    #[arg(long, value_name = "PATH")]
    pub log_file: Option<PathBuf>,
    /// Beside each model (a directory with config.json, or a .blz), show a read-only NAME.<CAST>.gguf, computed on demand from the store: the bytes `ckptfs export NAME --to gguf --cast CAST` writes.
    #[arg(long, value_enum, value_name = "CAST")]
    pub gguf: Option<ExportCast>,
    /// `auto`: checkpoint families (doc/SEMANTICS.md). A committed `.safetensors` is stored standalone, then, in the background, the older members of its family it is most like (the same name in sibling directories, or their shards) are rewritten as deltas against it, when that is at least 20% smaller; a file with a `user.ckptfs.base` xattr is stored as a delta against the file it names.
    #[arg(long, value_enum, value_name = "MODE")]
    pub delta: Option<DeltaMode>,
    /// With `--delta auto`: the longest chain of deltas behind a standalone checkpoint (1-4; default 3). Longer saves more disk; every level adds a decode to reading the oldest.
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u32).range(1..=4), requires = "delta")]
    pub family_depth: Option<u32>,
    /// S3 stores (STORE = s3://BUCKET/PREFIX): the S3 endpoint, for S3-compatible servers (default: AWS_ENDPOINT_URL, else AWS).
    #[arg(long, value_name = "URL")]
    pub endpoint_url: Option<String>,
    /// S3 stores: where the local copy of fetched bytes is kept across restarts (default: ~/.cache/ckptfs/s3/<hash of endpoint, bucket, prefix>).
    #[arg(long, value_name = "DIR")]
    pub cache_dir: Option<PathBuf>,
    /// S3 stores: the most disk the cache directory may hold, e.g. 20G; least recently used bytes are freed first (default: the last limit given for this cache directory, else 32G or half the size of its file system, whichever is smaller).
    #[arg(long, value_name = "SIZE")]
    pub disk_cache_size: Option<String>,
    /// S3 stores: seconds between listings of the bucket (new, replaced and removed objects show up within this time).
    #[arg(long, value_name = "SECS", default_value_t = 60.0)]
    pub metadata_ttl: f64,
    /// S3 stores: seconds before a request to the server is given up (retried 3 times with backoff).
    #[arg(long, value_name = "SECS", default_value_t = 30.0)]
    pub request_timeout: f64,
    /// S3 stores: the most seconds a read (or open, lookup, directory listing) waits for the server in all, whatever the retries; then it fails with EIO (default: 5 × --request-timeout).
    #[arg(long, value_name = "SECS")]
    pub read_timeout: Option<f64>,
    /// Serve the counters of `ckptfs stats` in Prometheus's text format at http://ADDR/metrics, e.g. 127.0.0.1:9100 (off by default; only the address given is opened).
    #[arg(long, value_name = "ADDR")]
    pub metrics_addr: Option<String>,
    /// Options in mount(8)'s form, comma-separated, as /etc/fstab gives them (`ckptfs STORE MNT -o ro,allow_other,cache_size=4G`): every flag above as NAME or NAME=VALUE (`cache_size=4G`, `delta=auto`, `threads=8`), `ro`/`rw`, `allow_other`, `nonempty`, `default_permissions`, `noexec`, `noatime`, `sync`, `dirsync`; mount(8)'s own (`nofail`, `_netdev`, `noauto`, `x-systemd.*`, ...) are ignored; anything else is refused.
    #[arg(short = 'o', value_name = "OPTIONS")]
    pub options: Vec<String>,
    /// Run by mount(8) (`ckptfs STORE MNT -o ...`): log to syslog unless
    /// --log-file says otherwise, print nothing on success.
    #[arg(long, hide = true)]
    pub mount_helper: bool,
}

#[derive(Debug, clap::Args)]
pub struct StatsArgs {
    /// The mountpoint (or any path inside the mount).
    pub mountpoint: PathBuf,
    /// One JSON object instead of a `name value` line per counter.
    #[arg(long)]
    pub json: bool,
}

#[derive(Debug, clap::Args)]
pub struct UmountArgs {
    pub mountpoint: PathBuf,
    /// Detach now even if files are open and return at once; the daemon
    /// exits when they close (without --lazy, umount waits until the daemon
    /// has compressed what was written and exited).
    #[arg(short, long)]
    pub lazy: bool,
    /// Give up waiting for the daemon after this many seconds (exit 1; the
    /// daemon goes on and exits when done).
    #[arg(long, value_name = "SECS")]
    pub timeout: Option<f64>,
}

#[derive(Debug, clap::Args)]
pub struct HoldArgs {
    /// The store (the STORE of `ckptfs mount STORE MNT`).
    pub store: PathBuf,
    /// Give up if the store cannot be held within this many seconds (a
    /// commit in progress is waited for; exit 1).
    #[arg(long, value_name = "SECS")]
    pub timeout: Option<f64>,
    /// The command to run while commits wait, and its arguments; its exit
    /// code is ckptfs's.
    #[arg(last = true, required = true, value_name = "COMMAND")]
    pub command: Vec<std::ffi::OsString>,
}

#[derive(Debug, clap::Args)]
pub struct RepackArgs {
    /// The store (the STORE of `ckptfs mount STORE MNT`); refused while a writable mount serves it.
    pub store: PathBuf,
    /// Print the families and the steps, change nothing.
    #[arg(short = 'n', long)]
    pub dry_run: bool,
    /// The longest chain of deltas behind a standalone checkpoint (1-4; default 3), as `mount --family-depth`.
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u32).range(1..=4))]
    pub family_depth: Option<u32>,
}
