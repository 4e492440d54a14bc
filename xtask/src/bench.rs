//! `cargo xtask bench`.

use std::path::Path;

use anyhow::Result;

pub fn run(_tracer: &Path) -> Result<()> {
    anyhow::bail!("not yet")
}
