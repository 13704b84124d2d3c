//! One module per subcommand. Each returns an exit code or an error whose
//! one-line message names the file and what is wrong.

mod blazex;
mod blz;
mod daemon_state;
mod delta;
mod export;
mod extract;
mod hold;
mod info;
mod list;
mod mount;
mod mount_options;
mod mount_s3;
mod pack;
mod patch;
mod repack;
mod s3;
mod seal;
mod stats;
mod unpack;
mod verify;
mod z4delta;

use crate::cli::{Cli, Command};
use anyhow::Context as _;
use indicatif::{ProgressBar, ProgressStyle};
use std::io::IsTerminal;
use std::path::PathBuf;
use std::process::ExitCode;

/// Decodes the first file of an archive into `w` (used by benchmarks).
pub fn unpack_to(a: &dyn crate::archive::ArchiveView, w: &mut dyn std::io::Write) -> Result<()> {
    Ok(crate::archive::write_to(a, 0, w, &|_| {})?)
}

pub type Error = anyhow::Error;
pub type Result<T> = anyhow::Result<T>;

/// Options shared by every subcommand.
#[derive(Debug, Clone, Copy)]
pub struct Global {
    pub quiet: bool,
}

pub fn run(mut cli: Cli) -> Result<ExitCode> {
    if let Command::Mount(a) = &mut cli.command {
        // `-o` lists (mount(8)'s form) before anything else: `threads=`
        // sizes the worker pool below.
        if let Some(n) = mount_options::apply(a).map_err(anyhow::Error::msg)? {
            cli.threads = Some(n);
        }
    }
    // Named workers: started lazily, the pool's threads took the name of
    // whichever thread first used it (in the mount, a FUSE thread), so
    // `top -H` and profiles showed the decoders as one FUSE thread.
    let mut pool = rayon::ThreadPoolBuilder::new().thread_name(|i| format!("ckptfs-work-{i}"));
    if let Some(n) = cli.threads {
        pool = pool.num_threads(n.max(1));
    }
    pool.build_global()
        .context("cannot start the worker threads")?;
    let g = Global { quiet: cli.quiet };
    // Messages about `s3://` objects name their URLs, not the local copies
    // the commands work on.
    run_command(g, cli).map_err(s3::named_error)
}

fn run_command(g: Global, cli: Cli) -> Result<ExitCode> {
    match cli.command {
        Command::Pack(mut a) => match s3::upload_target(a.output.as_deref())? {
            Some(up) => {
                a.output = Some(up.local.clone());
                let code = pack::run(g, a)?;
                up.finish()?;
                Ok(code)
            }
            None => pack::run(g, a),
        },
        Command::Unpack(mut a) => {
            let mut files = [a.input.clone()];
            let _tmp = s3::localize(&mut files)?;
            if _tmp.is_some() && a.output.is_none() {
                // Beside the caller, not in the temporary directory.
                let name = files[0].file_name().map(PathBuf::from).unwrap_or_default();
                a.output = Some(if crate::archive::open(&files[0])?.files() == 1 {
                    unpack::default_output(&name, false)
                } else {
                    unpack::default_dir(&name)
                });
            }
            a.input = files[0].clone();
            // Errors name the object's URL (`s3::named_error`).
            unpack::run(g, a)
        }
        Command::Info(mut a) => {
            let _tmp = s3::localize(&mut a.files)?;
            info::run(g, a)
        }
        Command::Verify(mut a) => {
            let _tmp = s3::localize(&mut a.files)?;
            verify::run(g, a)
        }
        Command::Seal(a) => seal::run(g, a),
        Command::List(a) => list::run(g, a),
        Command::Extract(a) => extract::run(g, a),
        Command::Export(a) => export::run(g, a),
        Command::Diff(a) => patch::diff(g, a),
        Command::Apply(a) => patch::apply(g, a),
        Command::Mount(a) => mount::run(g, *a, cli.threads),
        Command::Umount(a) => mount::umount(g, a),
        Command::Stats(a) => stats::run(g, a),
        Command::Hold(a) => hold::run(g, a),
        Command::Repack(a) => repack::run(g, a),
    }
}

/// An error and its causes on one line ("path: what: cause"), like
/// `{:#}`, but without a cause the message above it already quotes (most
/// of our errors print their source in their own message as well).
pub fn one_line(e: &(dyn std::error::Error + 'static)) -> String {
    let mut line = String::new();
    let mut next = Some(e);
    while let Some(cause) = next {
        next = cause.source();
        let text = cause.to_string();
        if line.is_empty() {
            line = text;
        } else if !line.contains(&text) {
            line.push_str(": ");
            line.push_str(&text);
        }
    }
    line
}

/// `n` and the noun that fits it: `1 shard`, `0 shards`.
pub fn plural(n: usize, one: &str, many: &str) -> String {
    format!("{n} {}", if n == 1 { one } else { many })
}

/// A byte-counting progress bar, shown only on a terminal and only for work
/// large enough to take a moment.
pub fn progress(g: Global, total: u64, msg: &str) -> ProgressBar {
    if g.quiet || !std::io::stderr().is_terminal() || total < 64 << 20 {
        return ProgressBar::hidden();
    }
    let pb = ProgressBar::new(total);
    pb.set_style(
        ProgressStyle::with_template(
            "{msg} [{bar:30}] {bytes}/{total_bytes} {bytes_per_sec} eta {eta}",
        )
        .expect("static template")
        .progress_chars("=> "),
    );
    pb.set_message(msg.to_string());
    pb
}

/// What a file holds, decided by its magic bytes.
pub enum Input {
    /// Any kind of archive ckptfs reads.
    Archive(std::sync::Arc<dyn crate::archive::ArchiveView>),
    /// A bare codec frame (`.z4ai` as the z4ai CLI writes it).
    Frame(memmap2::Mmap),
}

pub fn open_input(path: &std::path::Path) -> Result<Input> {
    use std::io::Read;
    let mut f = std::fs::File::open(path).with_context(|| path.display().to_string())?;
    let mut magic = [0u8; 8];
    let n = f
        .read(&mut magic)
        .with_context(|| path.display().to_string())?;
    // Archives, and the z4ai kinds ckptfs names and refuses, are the
    // archive layer's to open (or to refuse, with the same message as the
    // mount's).
    let head = &magic[..n];
    if crate::archive::Kind::detect(head).is_some()
        || crate::archive::unsupported_kind(head).is_some()
    {
        return Ok(Input::Archive(crate::archive::open(path)?));
    }
    match &magic[..n.min(4)] {
        b"Z4AI" | b"ZSP1" | b"ZPL1" => {
            // SAFETY: read-only private map of a file we only read.
            let map =
                unsafe { memmap2::Mmap::map(&f) }.with_context(|| path.display().to_string())?;
            Ok(Input::Frame(map))
        }
        _ => Err(anyhow::anyhow!(
            "{}: not an archive ckptfs reads or a z4ai frame (it starts \"{}\")",
            path.display(),
            head.escape_ascii()
        )),
    }
}
