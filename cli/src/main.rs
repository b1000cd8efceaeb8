//! `skilleval`: the command line. Parses arguments, sets up logging, and hands over to the lib.

use std::process::ExitCode;

use clap::Parser;
use skilleval_cli::{Cli, EXIT_BAD_INPUT};

/// The services' allocator here too: validating a 100,000-case definition spent 45 % of its
/// CPU in glibc's `malloc`/`free` (perf).
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() -> ExitCode {
    let cli = Cli::parse();
    skilleval_cli::init_logging(cli.verbose);
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("error: cannot start the async runtime: {e}");
            return ExitCode::from(EXIT_BAD_INPUT);
        }
    };
    let code = runtime.block_on(skilleval_cli::dispatch(cli));
    ExitCode::from(code)
}
