//! `cargo xtask screenshots`: the pictures of `tracer view` in docs/, taken again from the
//! bundled demo (a server, 3 clients, TCP and a pipe) so that they show what the viewer draws
//! today: one PNG per tab, by headless Chromium (installed by `cargo xtask setup --test`), the tab
//! chosen by the address's fragment.

use std::{
    io::{BufRead as _, BufReader},
    path::Path,
    process::{Command, Stdio},
};

use anyhow::{Context as _, Result, bail};

use crate::{demo, root, run_checked};

/// Each tab of the page and the file its picture goes to, with the window height it needs.
const TABS: [(&str, &str, u32); 4] = [
    ("flame", "docs/view.png", 560),
    ("functions", "docs/view-functions.png", 560),
    ("calls", "docs/view-calls.png", 560),
    ("processes", "docs/view-processes.png", 760),
];

pub fn run(tracer: &Path) -> Result<()> {
    let dir = root().join("target/screenshots");
    std::fs::create_dir_all(&dir)?;
    let jsonl = dir.join("trace.jsonl");
    demo::record(tracer, &dir, &jsonl)?;
    let mut viewer = Command::new(tracer)
        .arg("view")
        .arg(&jsonl)
        .arg("--no-open")
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .context("cannot start tracer view")?;
    // "tracer: read N events from ...; the page is at http://127.0.0.1:PORT/?token=... (Ctrl-C to stop)"
    let url = BufReader::new(viewer.stderr.take().context("no stderr")?)
        .lines()
        .map_while(Result::ok)
        .find_map(|l| l.split_whitespace().find(|w| w.starts_with("http://127.0.0.1:")).map(str::to_string));
    let result = url.context("tracer view printed no address").and_then(|url| shoot(&url, &dir));
    let _ = viewer.kill();
    let _ = viewer.wait();
    result
}

fn shoot(url: &str, dir: &Path) -> Result<()> {
    for (tab, file, height) in TABS {
        let out = root().join(file);
        let profile = dir.join("chromium-profile");
        run_checked(
            Command::new("chromium")
                .args(["--headless", "--no-sandbox", "--disable-gpu", "--no-first-run", "--hide-scrollbars"])
                .arg(format!("--user-data-dir={}", profile.display()))
                .arg(format!("--window-size=1100,{height}"))
                .arg("--virtual-time-budget=5000")
                .arg(format!("--screenshot={}", out.display()))
                .arg(format!("{url}#{tab}"))
                // Chromium's complaints about D-Bus and GPUs a headless run has not.
                .stderr(Stdio::null()),
        )?;
        if !out.exists() {
            bail!("chromium wrote no {}", out.display());
        }
        println!("xtask: {}", out.display());
    }
    Ok(())
}
