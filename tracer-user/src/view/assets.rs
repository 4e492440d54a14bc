//! The page, embedded in the binary: it works offline and needs nothing but tracer. Plain
//! JavaScript with no library: the flame graph is positioned `div`s, which keeps the page small
//! and every name a text node (`textContent`, never `innerHTML`).

pub const INDEX_HTML: &str = include_str!("assets/index.html");
pub const APP_JS: &str = include_str!("assets/app.js");
pub const STYLE_CSS: &str = include_str!("assets/style.css");
