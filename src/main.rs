use clap::Parser;
use std::process::ExitCode;

fn main() -> ExitCode {
    ckptfs::tune_allocator();
    let cli =
        ckptfs::cli::Cli::parse_from(ckptfs::cli::with_mount_helper_form(std::env::args_os()));
    if !matches!(cli.command, ckptfs::cli::Command::Mount(_)) {
        // A command whose output is piped into `head` ends quietly when the
        // reader goes away, as other Unix tools do, instead of panicking in
        // println! on EPIPE. (The mount daemon keeps SIGPIPE ignored.)
        // SAFETY: restores a default disposition before any thread exists.
        unsafe { libc::signal(libc::SIGPIPE, libc::SIG_DFL) };
    }
    match ckptfs::commands::run(cli) {
        Ok(code) => code,
        Err(e) => {
            // The error and its context on one line ("path: cause").
            eprintln!("ckptfs: {}", ckptfs::commands::one_line(&*e));
            ExitCode::from(1)
        }
    }
}
