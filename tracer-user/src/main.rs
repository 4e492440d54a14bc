use std::process::ExitCode;

use clap::Parser as _;
use tracer_user::cli::{Cli, run};

fn main() -> ExitCode {
    let cli = Cli::parse();
    match run(cli) {
        Ok(code) => ExitCode::from(u8::try_from(code).unwrap_or(1)),
        Err(e) => {
            eprintln!("tracer: error: {e:#}");
            ExitCode::FAILURE
        }
    }
}
