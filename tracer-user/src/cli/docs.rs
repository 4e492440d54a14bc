//! `tracer docs DIR` (hidden; `cargo xtask dist` runs it): the man pages and shell completions,
//! generated from the command-line definitions themselves so that they never drift from
//! `--help`.

use std::path::Path;

use clap::CommandFactory as _;
use clap_complete::Shell;

use super::Cli;

/// Writes `DIR/man/tracer.1` and `tracer-SUBCOMMAND.1` for each subcommand, and
/// `DIR/completions/` for bash, zsh and fish.
pub fn generate(dir: &Path) -> anyhow::Result<i32> {
    let man = dir.join("man");
    let completions = dir.join("completions");
    std::fs::create_dir_all(&man)?;
    std::fs::create_dir_all(&completions)?;
    clap_mangen::generate_to(Cli::command(), &man)?;
    for shell in [Shell::Bash, Shell::Zsh, Shell::Fish] {
        clap_complete::generate_to(shell, &mut Cli::command(), "tracer", &completions)?;
    }
    Ok(0)
}
