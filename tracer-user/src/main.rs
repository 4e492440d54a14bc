use std::process::ExitCode;

use clap::Parser as _;
mod cli;

use cli::{Cli, run};

fn main() -> ExitCode {
    cli::stderr::install();
    cli::kernel_log::install();
    let cli = Cli::parse();
    match run(cli) {
        Ok(code) => ExitCode::from(u8::try_from(code).unwrap_or(1)),
        Err(e) => {
            cli::stderr::error(format_args!("{e:#}"));
            ExitCode::FAILURE
        }
    }
}
