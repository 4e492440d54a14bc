//! `tracer view` and the `--serve` option of `record` and `collect`: the viewer's page (see
//! [`tracer_user::view`]) for a recorded trace or one being recorded.

use std::{
    net::{Ipv4Addr, SocketAddr},
    path::PathBuf,
    sync::{Arc, Mutex},
};

use anyhow::Context as _;
use clap::Args;
use tracer_user::view::{
    model::{SharedSink, ViewModel},
    server::{self, Content, Counters, ServeOptions, Viewer},
};

#[derive(Debug, Args)]
pub struct ViewArgs {
    /// A trace written by `tracer record` or `tracer collect` (JSON lines or native).
    #[arg(default_value = "trace.jsonl")]
    pub input: PathBuf,
    /// Serve on this port of 127.0.0.1 (default: a free one).
    #[arg(long, value_name = "N", default_value_t = 0)]
    pub port: u16,
    /// Print the page's address, do not open a browser.
    #[arg(long)]
    pub no_open: bool,
}

/// `--serve` and its TLS files, for `record` and `collect`.
#[derive(Debug, Args)]
pub struct ServeArgs {
    /// Serve the viewer's page while tracing, on this address (default: 127.0.0.1 and a free
    /// port). Any other address than loopback needs --tls-cert and --tls-key.
    #[arg(long, value_name = "ADDR", num_args = 0..=1, default_missing_value = "127.0.0.1:0")]
    pub serve: Option<SocketAddr>,
    /// TLS certificate chain (PEM) of the page's server (with --serve).
    #[arg(long, value_name = "PATH", requires = "serve", requires = "tls_key")]
    pub tls_cert: Option<PathBuf>,
    /// TLS private key (PEM).
    #[arg(long, value_name = "PATH", requires = "tls_cert")]
    pub tls_key: Option<PathBuf>,
}

impl ServeArgs {
    /// Refuses a non-loopback address without TLS before anything is traced.
    pub fn check(&self) -> anyhow::Result<()> {
        match self.serve {
            Some(addr) if !addr.ip().is_loopback() && self.tls_cert.is_none() => {
                Err(server::ServeError::NeedsTls(addr).into())
            }
            _ => Ok(()),
        }
    }

    /// With `--serve`: the sink that feeds the page's `model`, and the server, started.
    pub fn start(&self, model: ViewModel, counters: Counters) -> anyhow::Result<Option<(SharedSink, Viewer)>> {
        let Some(addr) = self.serve else { return Ok(None) };
        let model = Arc::new(Mutex::new(model));
        let options = ServeOptions { addr, tls_cert: self.tls_cert.clone(), tls_key: self.tls_key.clone() };
        let content = Content { model: model.clone(), trace_file: None, counters: Some(counters) };
        let viewer = server::serve(&options, content).context("cannot serve the viewer")?;
        super::stderr::info(format_args!("the live view is at {}", viewer.url));
        Ok(Some((SharedSink(model), viewer)))
    }
}

pub fn view(args: ViewArgs) -> anyhow::Result<i32> {
    let mut model = ViewModel::default();
    let started = std::time::Instant::now();
    let replayed = super::replay(&args.input, super::open_trace(&args.input)?, &mut model)?;
    let options =
        ServeOptions { addr: SocketAddr::from((Ipv4Addr::LOCALHOST, args.port)), tls_cert: None, tls_key: None };
    let content = Content { model: Arc::new(Mutex::new(model)), trace_file: Some(args.input.clone()), counters: None };
    let viewer = server::serve(&options, content).context("cannot serve the viewer")?;
    super::stderr::info(format_args!(
        "read {} events from {} in {:.2} s; the page is at {} (Ctrl-C to stop)",
        replayed.events,
        args.input.display(),
        started.elapsed().as_secs_f64(),
        viewer.url
    ));
    if !args.no_open {
        open_browser(&viewer.url);
    }
    viewer.wait();
    Ok(0)
}

/// Opens the page in the desktop's browser when there is a desktop (`xdg-open`).
fn open_browser(url: &str) {
    let desktop = ["DISPLAY", "WAYLAND_DISPLAY"].iter().any(|v| std::env::var_os(v).is_some_and(|s| !s.is_empty()));
    let Ok(opener) = which::which("xdg-open") else { return };
    if !desktop {
        return;
    }
    let spawned = std::process::Command::new(opener)
        .arg(url)
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn();
    match spawned {
        // Reaped by a thread of its own: the server runs until Ctrl-C.
        Ok(mut child) => drop(std::thread::spawn(move || child.wait())),
        Err(e) => super::stderr::warning(format_args!("cannot open a browser ({e}): open the address above")),
    }
}
