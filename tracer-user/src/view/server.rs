//! The viewer's HTTP server: the page and its JSON, to whoever has the token.
//!
//! HTTP/1.1, one request a connection (the page asks for little: a few files and the state, or
//! while live the state as a stream of server-sent events, `/api/events`). Requests are parsed by
//! `httparse`; everything before the token is checked is bounded: the request head's size and
//! time, and the connections open at once (the others are closed at once, and counted).
//!
//! The event stream holds its connection (one of [`MAX_CONNECTIONS`]) while the trace runs. It
//! queues nothing: every [`STREAM_INTERVAL`] it takes a fresh snapshot of the model and writes it
//! as one `data:` message, and that write must be taken within [`STREAM_WRITE_TIMEOUT`], else
//! the reader is too slow and its connection is closed (and counted): a slow reader costs at
//! most one message's bytes, never a backlog. Once the trace ended it sends the final state as an
//! `end` message and closes; the page then stops listening (a closed stream is otherwise
//! reopened by the browser's `EventSource`). The token is 256 random bits. It comes in the URL's query once
//! (`/?token=...`), which answers with a redirect to `/` that sets it as an `HttpOnly`,
//! `SameSite=Strict` cookie, so that it leaves the address bar and no other site's page can send
//! it; every request without it, in the cookie or the query, is refused (403). Tokens are compared
//! in constant time. A non-loopback address is served only over TLS (the agent's certificates).

use std::{
    net::SocketAddr,
    path::PathBuf,
    sync::{
        Arc, Mutex,
        atomic::{AtomicU64, Ordering},
    },
    time::Duration,
};

use subtle::ConstantTimeEq;
use tokio::{
    io::{AsyncReadExt, AsyncWriteExt},
    sync::Semaphore,
};

use super::{
    assets, calls_page,
    model::{State, ViewModel},
};
use crate::cluster::tls::{self, TlsError, Transport};

/// Connections served at once; more are closed as they arrive.
pub const MAX_CONNECTIONS: usize = 64;
/// A request's head (request line and headers), at most.
pub const MAX_HEAD_BYTES: usize = 16 * 1024;
/// Headers in a request, at most.
const MAX_HEADERS: usize = 64;
/// Time to send a request's head (and to finish a TLS handshake).
const HEAD_TIMEOUT: Duration = Duration::from_secs(10);
/// Time to take a response.
const WRITE_TIMEOUT: Duration = Duration::from_secs(30);
/// The highest call-tree page asked for (200 lines each: 200 million lines).
const MAX_PAGE: u64 = 1_000_000;
/// How often the event stream sends the state: at least twice a second.
pub const STREAM_INTERVAL: Duration = Duration::from_millis(400);
/// Time for a reader of the event stream to take one message; a slower reader is dropped.
pub const STREAM_WRITE_TIMEOUT: Duration = Duration::from_secs(5);
const COOKIE: &str = "tracer_token";

#[derive(Debug, thiserror::Error)]
pub enum ServeError {
    #[error("{0} is not a loopback address: serving it needs --tls-cert and --tls-key")]
    NeedsTls(SocketAddr),
    #[error("cannot listen on {addr}")]
    Bind { addr: SocketAddr, source: std::io::Error },
    #[error(transparent)]
    Tls(#[from] TlsError),
    #[error("cannot make the viewer's token")]
    Token(#[source] getrandom::Error),
    #[error("cannot start the viewer")]
    Start(#[source] std::io::Error),
}

/// Where and how to serve.
#[derive(Clone, Debug)]
pub struct ServeOptions {
    pub addr: SocketAddr,
    pub tls_cert: Option<PathBuf>,
    pub tls_key: Option<PathBuf>,
}

/// A live recording's running figures: events written, events lost.
pub type Counters = Arc<dyn Fn() -> (u64, u64) + Send + Sync>;

/// What is served.
pub struct Content {
    pub model: Arc<Mutex<ViewModel>>,
    /// The trace's file, read again for the call tree (none while recording: not yet readable).
    pub trace_file: Option<PathBuf>,
    pub counters: Option<Counters>,
}

/// A running server.
pub struct Viewer {
    /// The address to open, with the token.
    pub url: String,
    thread: std::thread::JoinHandle<()>,
    /// Set once the trace ended: every open event stream sends its `end` message at once.
    ended: tokio::sync::watch::Sender<bool>,
}

/// How long [`Viewer::finish`] waits for the open event streams to send their `end` message.
pub const FINISH_TIMEOUT: Duration = Duration::from_secs(2);

impl Viewer {
    /// Serves until the process ends.
    pub fn wait(self) {
        let _ = self.thread.join();
    }

    /// For a live trace that has ended (its model has its end): each open event stream sends
    /// the final state as its `end` message now, rather than at its next tick, and this returns
    /// once they have (or after [`FINISH_TIMEOUT`]), so that a page open when tracer exits
    /// shows the trace whole instead of a broken stream.
    pub fn finish(self) {
        self.ended.send_replace(true);
        let deadline = std::time::Instant::now() + FINISH_TIMEOUT;
        // Each stream holds a receiver until it has sent its `end`; the server holds one more.
        while self.ended.receiver_count() > 1 && std::time::Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(10));
        }
    }
}

struct App {
    content: Content,
    token: String,
    secure: bool,
    connections: Arc<Semaphore>,
    /// Connections closed because [`MAX_CONNECTIONS`] were open.
    refused: AtomicU64,
    /// Event streams closed because their reader did not take a message in time.
    slow_readers: AtomicU64,
    /// One call-tree page is read at a time (each reads the trace's file).
    calls: Semaphore,
    /// Whether the trace ended ([`Viewer::finish`]); each event stream holds a clone.
    ended: tokio::sync::watch::Receiver<bool>,
}

/// Starts serving `content` on its own thread; returns once it listens.
pub fn serve(options: &ServeOptions, content: Content) -> Result<Viewer, ServeError> {
    let acceptor = match (&options.tls_cert, &options.tls_key) {
        (Some(cert), Some(key)) => Some(tls::acceptor(cert, key)?),
        _ if !options.addr.ip().is_loopback() => return Err(ServeError::NeedsTls(options.addr)),
        _ => None,
    };
    let listener = std::net::TcpListener::bind(options.addr)
        .and_then(|l| l.set_nonblocking(true).map(|()| l))
        .map_err(|source| ServeError::Bind { addr: options.addr, source })?;
    let addr = listener.local_addr().map_err(|source| ServeError::Bind { addr: options.addr, source })?;
    let mut secret = [0u8; 32];
    getrandom::fill(&mut secret).map_err(ServeError::Token)?;
    let token: String = secret.iter().map(|b| format!("{b:02x}")).collect();
    let scheme = if acceptor.is_some() { "https" } else { "http" };
    let url = format!("{scheme}://{addr}/?token={token}");
    let (ended, ended_receiver) = tokio::sync::watch::channel(false);
    let app = Arc::new(App {
        content,
        token,
        secure: acceptor.is_some(),
        connections: Arc::new(Semaphore::new(MAX_CONNECTIONS)),
        refused: AtomicU64::new(0),
        slow_readers: AtomicU64::new(0),
        calls: Semaphore::new(1),
        ended: ended_receiver,
    });
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().map_err(ServeError::Start)?;
    let thread = std::thread::Builder::new()
        .name("viewer".into())
        .spawn(move || {
            runtime.block_on(async move {
                let listener = match tokio::net::TcpListener::from_std(listener) {
                    Ok(l) => l,
                    Err(e) => return tracing::error!("the viewer cannot listen: {e}"),
                };
                accept_loop(listener, acceptor, app).await
            })
        })
        .map_err(ServeError::Start)?;
    Ok(Viewer { url, thread, ended })
}

async fn accept_loop(listener: tokio::net::TcpListener, acceptor: Option<tokio_rustls::TlsAcceptor>, app: Arc<App>) {
    loop {
        let (tcp, peer) = match listener.accept().await {
            Ok(c) => c,
            Err(e) => {
                // Out of file descriptors and the like: wait for some to be freed.
                tracing::warn!("the viewer cannot accept a connection: {e}");
                tokio::time::sleep(Duration::from_millis(100)).await;
                continue;
            }
        };
        let Ok(permit) = app.connections.clone().try_acquire_owned() else {
            let refused = app.refused.fetch_add(1, Ordering::Relaxed) + 1;
            tracing::warn!(
                "the viewer closed a connection from {peer}: {MAX_CONNECTIONS} are open ({refused} closed so far)"
            );
            continue;
        };
        let (app, acceptor) = (app.clone(), acceptor.clone());
        tokio::spawn(async move {
            let _permit = permit;
            let stream: Box<dyn Transport> = match acceptor {
                None => Box::new(tcp),
                Some(acceptor) => match tokio::time::timeout(HEAD_TIMEOUT, acceptor.accept(tcp)).await {
                    Ok(Ok(tls)) => Box::new(tls),
                    _ => return tracing::debug!("the viewer's TLS handshake with {peer} failed"),
                },
            };
            if let Err(e) = connection(stream, &app).await {
                tracing::debug!("the viewer's connection from {peer}: {e}");
            }
        });
    }
}

/// A response: status, content type, extra headers, body.
struct Response {
    status: u16,
    content_type: &'static str,
    headers: Vec<(&'static str, String)>,
    body: Vec<u8>,
}

impl Response {
    fn new(status: u16, content_type: &'static str, body: impl Into<Vec<u8>>) -> Self {
        Response { status, content_type, headers: Vec::new(), body: body.into() }
    }
    fn text(status: u16, text: &str) -> Self {
        Response::new(status, "text/plain; charset=utf-8", format!("{text}\n"))
    }
    fn json(value: &impl serde::Serialize) -> Self {
        match serde_json::to_vec(value) {
            Ok(body) => Response::new(200, "application/json", body),
            Err(e) => Response::text(500, &format!("cannot encode the answer: {e}")),
        }
    }

    /// The status line and headers; `Content-Length` unless the body is a stream.
    fn head(&self, content_length: Option<usize>) -> String {
        let reason = match self.status {
            200 => "OK",
            303 => "See Other",
            400 => "Bad Request",
            403 => "Forbidden",
            404 => "Not Found",
            405 => "Method Not Allowed",
            431 => "Request Header Fields Too Large",
            _ => "Internal Server Error",
        };
        let mut head = format!(
            "HTTP/1.1 {} {reason}\r\nContent-Type: {}\r\nConnection: close\r\n\
             Cache-Control: no-store\r\nX-Content-Type-Options: nosniff\r\nReferrer-Policy: no-referrer\r\n\
             X-Frame-Options: DENY\r\nContent-Security-Policy: default-src 'none'; script-src 'self'; \
             style-src 'self'; connect-src 'self'; img-src 'self'; frame-ancestors 'none'\r\n",
            self.status, self.content_type,
        );
        if let Some(length) = content_length {
            head += &format!("Content-Length: {length}\r\n");
        }
        for (name, value) in &self.headers {
            head += &format!("{name}: {value}\r\n");
        }
        head += "\r\n";
        head
    }

    fn bytes(&self) -> Vec<u8> {
        let mut bytes = self.head(Some(self.body.len())).into_bytes();
        bytes.extend_from_slice(&self.body);
        bytes
    }
}

async fn connection(mut stream: Box<dyn Transport>, app: &App) -> std::io::Result<()> {
    let timed_out = |_| std::io::Error::from(std::io::ErrorKind::TimedOut);
    let head = tokio::time::timeout(HEAD_TIMEOUT, read_head(&mut stream)).await.map_err(timed_out)??;
    let oversized = head.is_none();
    let response = match head {
        Some(head) => match respond(&head, app).await {
            Answer::Page(response) => response,
            Answer::Events => return events(stream, app).await,
        },
        None => Response::text(431, "the request's head is too long"),
    };
    tokio::time::timeout(WRITE_TIMEOUT, async {
        stream.write_all(&response.bytes()).await?;
        stream.shutdown().await
    })
    .await
    .map_err(timed_out)??;
    if oversized {
        // The rest of the head is still unread: closing now would answer it with a reset, which
        // can reach the client before the 431 and discard it. Read it away first, bounded.
        let mut sink = [0u8; 4096];
        let _ = tokio::time::timeout(LINGER_TIME, async {
            let mut drained = 0;
            while drained < LINGER_BYTES {
                match stream.read(&mut sink).await {
                    Ok(0) | Err(_) => break,
                    Ok(n) => drained += n,
                }
            }
        })
        .await;
    }
    Ok(())
}

/// After refusing an oversized head: how long, and how many of its bytes, are read away before
/// the connection closes.
const LINGER_TIME: Duration = Duration::from_secs(1);
const LINGER_BYTES: usize = 1 << 20;

/// Reads up to the blank line that ends a request's head; `None` if it is longer than
/// [`MAX_HEAD_BYTES`].
async fn read_head(stream: &mut Box<dyn Transport>) -> std::io::Result<Option<Vec<u8>>> {
    let mut head = Vec::with_capacity(1024);
    let mut chunk = [0u8; 2048];
    loop {
        let n = stream.read(&mut chunk).await?;
        if n == 0 {
            return Err(std::io::ErrorKind::UnexpectedEof.into());
        }
        let searched_from = head.len().saturating_sub(3);
        head.extend_from_slice(&chunk[..n]);
        if head[searched_from..].windows(4).any(|w| w == b"\r\n\r\n") {
            return Ok(Some(head));
        }
        if head.len() > MAX_HEAD_BYTES {
            return Ok(None);
        }
    }
}

/// The value of `name` in a query string (`a=1&b=2`), as sent (digits and hex, or percent-encoded).
fn query_value<'q>(query: &'q str, name: &str) -> Option<&'q str> {
    query.split('&').find_map(|pair| pair.split_once('=').filter(|(k, _)| *k == name).map(|(_, v)| v))
}

fn cookie_value<'c>(cookie_header: &'c str, name: &str) -> Option<&'c str> {
    cookie_header.split(';').find_map(|c| c.trim().split_once('=').filter(|(k, _)| *k == name).map(|(_, v)| v))
}

impl App {
    fn is_token(&self, candidate: &str) -> bool {
        candidate.as_bytes().ct_eq(self.token.as_bytes()).into()
    }
}

/// What a request gets: a page, or the event stream.
enum Answer {
    Page(Response),
    Events,
}

impl From<Response> for Answer {
    fn from(response: Response) -> Self {
        Answer::Page(response)
    }
}

async fn respond(head: &[u8], app: &App) -> Answer {
    let mut headers = [httparse::EMPTY_HEADER; MAX_HEADERS];
    let mut request = httparse::Request::new(&mut headers);
    match request.parse(head) {
        Ok(httparse::Status::Complete(_)) => {}
        Err(httparse::Error::TooManyHeaders) => return Response::text(431, "too many headers").into(),
        _ => return Response::text(400, "not an HTTP request").into(),
    }
    let target = request.path.unwrap_or("/");
    let (path, query) = target.split_once('?').unwrap_or((target, ""));
    let from_query = query_value(query, "token").is_some_and(|t| app.is_token(t));
    let from_cookie = request
        .headers
        .iter()
        .filter(|h| h.name.eq_ignore_ascii_case("cookie"))
        .filter_map(|h| std::str::from_utf8(h.value).ok())
        .filter_map(|c| cookie_value(c, COOKIE))
        .any(|t| app.is_token(t));
    if !(from_query || from_cookie) {
        return Response::text(403, "forbidden: open the address tracer printed, with its token").into();
    }
    if request.method != Some("GET") {
        return Response::text(405, "only GET").into();
    }
    if from_query && path == "/" {
        let mut r = Response::new(303, "text/plain; charset=utf-8", Vec::new());
        r.headers.push(("Location", "/".to_string()));
        let secure = if app.secure { "; Secure" } else { "" };
        r.headers.push(("Set-Cookie", format!("{COOKIE}={}; Path=/; HttpOnly; SameSite=Strict{secure}", app.token)));
        return r.into();
    }
    let response = match path {
        "/" | "/index.html" => Response::new(200, "text/html; charset=utf-8", assets::INDEX_HTML),
        "/app.js" => Response::new(200, "text/javascript; charset=utf-8", assets::APP_JS),
        "/style.css" => Response::new(200, "text/css; charset=utf-8", assets::STYLE_CSS),
        "/api/state" => Response::json(&app.state()),
        "/api/events" => return Answer::Events,
        "/api/calls" => calls(query, app).await,
        _ => Response::text(404, "no such page"),
    };
    response.into()
}

impl App {
    /// The model's state now, with the recording's figures.
    fn state(&self) -> State {
        let mut state = {
            let model = self.content.model.lock().unwrap_or_else(|p| p.into_inner());
            model.state()
        };
        if let Some(counters) = &self.content.counters {
            let (written, lost) = counters();
            state.written = Some(written);
            state.lost = Some(lost);
        }
        state
    }
}

/// `/api/events`: the state every [`STREAM_INTERVAL`] while the trace runs, then once more as an
/// `end` message (at once when [`Viewer::finish`] says the trace ended). Each message is written
/// within [`STREAM_WRITE_TIMEOUT`] or the stream is closed.
async fn events(mut stream: Box<dyn Transport>, app: &App) -> std::io::Result<()> {
    let mut ended = app.ended.clone();
    let mut head = Response::new(200, "text/event-stream; charset=utf-8", Vec::new()).head(None).into_bytes();
    // Tells the browser to reopen a dropped stream after a second.
    head.extend_from_slice(b"retry: 1000\n\n");
    let mut message = head;
    let mut tick = tokio::time::interval(STREAM_INTERVAL);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    // Until the viewer is dropped without finishing (an error ended the recording).
    let mut listening = true;
    loop {
        tokio::select! {
            _ = tick.tick() => {}
            changed = ended.changed(), if listening => listening = changed.is_ok(),
        }
        let state = app.state();
        let live = state.live;
        let json = serde_json::to_string(&state).map_err(std::io::Error::other)?;
        // JSON has no raw newline, so the state is one `data:` line.
        message.extend_from_slice(if live { b"event: state\ndata: " } else { b"event: end\ndata: " });
        message.extend_from_slice(json.as_bytes());
        message.extend_from_slice(b"\n\n");
        let sent = tokio::time::timeout(STREAM_WRITE_TIMEOUT, async {
            stream.write_all(&message).await?;
            stream.flush().await
        })
        .await;
        match sent {
            Ok(result) => result?,
            Err(_) => {
                let dropped = app.slow_readers.fetch_add(1, Ordering::Relaxed) + 1;
                tracing::warn!(
                    "the viewer closed an event stream whose reader took more than {} s for a message ({dropped} so far)",
                    STREAM_WRITE_TIMEOUT.as_secs()
                );
                return Err(std::io::ErrorKind::TimedOut.into());
            }
        }
        if !live {
            return tokio::time::timeout(WRITE_TIMEOUT, stream.shutdown()).await.unwrap_or(Ok(()));
        }
        message = Vec::new();
    }
}

async fn calls(query: &str, app: &App) -> Response {
    let number = |name: &str| query_value(query, name).and_then(|v| v.parse::<u64>().ok());
    let (Some(tid), page) = (number("tid").and_then(|t| u32::try_from(t).ok()), number("page").unwrap_or(0)) else {
        return Response::text(400, "which thread? (tid=N)");
    };
    // A host's name is the user's (`--agent NAME=...`): the page encodes it.
    let host = match query_value(query, "host").map(|h| percent_encoding::percent_decode_str(h).decode_utf8()) {
        None => None,
        Some(Ok(host)) => Some(host.into_owned()),
        Some(Err(_)) => return Response::text(400, "the host's name is not UTF-8"),
    };
    if page > MAX_PAGE {
        return Response::text(400, &format!("page {page} is past the last one served ({MAX_PAGE})"));
    }
    let Some(path) = app.content.trace_file.clone() else {
        return Response::json(&serde_json::json!({
            "host": host, "tid": tid, "page": page, "lines": [], "has_next": false,
            "note": "the call tree is shown once the trace is written: tracer view FILE"
        }));
    };
    let Ok(_permit) = app.calls.acquire().await else { return Response::text(500, "the viewer is stopping") };
    match tokio::task::spawn_blocking(move || calls_page::read(&path, host.as_deref(), tid, page)).await {
        Ok(Ok(page)) => Response::json(&page),
        Ok(Err(e)) => Response::text(500, &crate::errors::report(&e)),
        Err(e) => Response::text(500, &format!("the call tree's reader failed: {e}")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn query_and_cookie_values_are_found_by_their_whole_name() {
        assert_eq!(query_value("tid=7&page=2", "page"), Some("2"));
        assert_eq!(query_value("xtid=7", "tid"), None);
        assert_eq!(cookie_value("a=b; tracer_token=abc", COOKIE), Some("abc"));
        assert_eq!(cookie_value("my_tracer_token=abc", COOKIE), None);
    }

    /// A reader of the event stream that takes nothing: the server's writes fill the connection's
    /// 1 KiB, then the next message is not taken in time and the stream is closed, counted; the
    /// server never holds more than the message it is writing.
    #[tokio::test]
    async fn an_event_stream_reader_that_takes_nothing_is_dropped() {
        let app = App {
            content: Content { model: Arc::new(Mutex::new(ViewModel::default())), trace_file: None, counters: None },
            token: "t".into(),
            secure: false,
            connections: Arc::new(Semaphore::new(1)),
            refused: AtomicU64::new(0),
            slow_readers: AtomicU64::new(0),
            calls: Semaphore::new(1),
            ended: tokio::sync::watch::channel(false).1,
        };
        let (server_end, _reader) = tokio::io::duplex(1024);
        let ended = events(Box::new(server_end), &app).await;
        assert_eq!(ended.unwrap_err().kind(), std::io::ErrorKind::TimedOut);
        assert_eq!(app.slow_readers.load(Ordering::Relaxed), 1);
    }

    /// A live viewer with [`MAX_CONNECTIONS`] event streams open closes the next connection
    /// unanswered, serves again once a stream is closed, and when the trace ends every open
    /// stream gets its `end` message before [`Viewer::finish`] returns.
    #[test]
    fn event_streams_hold_connections_up_to_the_limit_and_all_get_the_end() {
        use std::io::{BufRead as _, BufReader, Read as _, Write as _};
        let model = Arc::new(Mutex::new(ViewModel::default()));
        let options = ServeOptions { addr: "127.0.0.1:0".parse().unwrap(), tls_cert: None, tls_key: None };
        let viewer = serve(&options, Content { model: model.clone(), trace_file: None, counters: None }).unwrap();
        let (base, token) = viewer.url.trim_start_matches("http://").split_once("/?token=").unwrap();
        let open = || {
            let mut stream = std::net::TcpStream::connect(base).unwrap();
            stream.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
            // A connection closed unanswered may be closed before the request is written.
            let _ = write!(stream, "GET /api/events HTTP/1.1\r\nHost: x\r\nCookie: {COOKIE}={token}\r\n\r\n");
            BufReader::new(stream)
        };
        // Reads up to the next message's event name.
        let next_event = |reader: &mut BufReader<std::net::TcpStream>| loop {
            let mut line = String::new();
            assert!(reader.read_line(&mut line).unwrap() > 0, "the stream closed");
            if let Some(name) = line.strip_prefix("event: ") {
                return name.trim_end().to_string();
            }
        };
        let mut streams: Vec<_> = (0..MAX_CONNECTIONS).map(|_| open()).collect();
        for stream in &mut streams {
            assert_eq!(next_event(stream), "state");
        }
        let mut refused = open();
        let mut answer = Vec::new();
        // Closed unanswered: an end of stream, or a reset since the request was left unread.
        let _ = refused.read_to_end(&mut answer);
        assert!(answer.is_empty(), "{}", String::from_utf8_lossy(&answer));

        // One stream closed frees its connection (the server sees it at its next write).
        drop(streams.pop());
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        let mut again = loop {
            let mut stream = open();
            let mut first = String::new();
            if stream.read_line(&mut first).unwrap_or(0) > 0 {
                assert!(first.starts_with("HTTP/1.1 200 "), "{first}");
                break stream;
            }
            assert!(std::time::Instant::now() < deadline, "no connection was freed");
            std::thread::sleep(Duration::from_millis(100));
        };
        assert_eq!(next_event(&mut again), "state");
        streams.push(again);

        crate::sink::Sink::end(&mut *model.lock().unwrap(), &crate::event::test_events::end(1000)).unwrap();
        viewer.finish();
        for stream in &mut streams {
            while next_event(stream) != "end" {}
        }
    }
}
