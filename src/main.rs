use clap::Parser;
use std::process::ExitCode;

fn main() -> ExitCode {
    ckptfs::tune_allocator();
    let cli = ckptfs::cli::Cli::parse();
    match ckptfs::commands::run(cli) {
        Ok(code) => code,
        Err(e) => {
            // `{:#}`: the error and its context on one line ("path: cause").
            eprintln!("ckptfs: {e:#}");
            ExitCode::from(1)
        }
    }
}
