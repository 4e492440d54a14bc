//! An interactive flame graph (`.svg`: click to zoom, Ctrl-F to search), rendered by inferno, the
//! Rust port of flamegraph.pl, from the folded stacks.
//!
//! Every stack gets a frame, however narrow (inferno's default hides frames under 0.1 pixel), so
//! that searching finds every function.

use std::io::{self, Write};

use crate::analysis::flame_stacks::{FlameNode, folded_lines};

/// Writes the flame graph of these roots as SVG.
pub fn write(roots: &[FlameNode], out: &mut dyn Write) -> io::Result<()> {
    let lines = folded_lines(roots);
    let mut options = inferno::flamegraph::Options::default();
    options.title = "tracer: time in traced calls".to_string();
    options.count_name = "ns".to_string();
    options.min_width = 0.0;
    // Same trace, same picture: colours from the function names, not at random.
    options.hash = true;
    options.deterministic = true;
    if lines.is_empty() {
        // inferno refuses an empty input; an empty graph says the same.
        options.subtitle = Some("no traced call returned".to_string());
        return inferno::flamegraph::from_lines(&mut options, ["(none) 1"], out).map_err(io::Error::other);
    }
    inferno::flamegraph::from_lines(&mut options, lines.iter().map(String::as_str), out).map_err(io::Error::other)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn node(name: &str, value: u64, children: Vec<FlameNode>) -> FlameNode {
        FlameNode { name: name.into(), value, children }
    }

    /// inferno's SVG starts with a DOCTYPE.
    fn parse(svg: &str) -> roxmltree::Document<'_> {
        let options = roxmltree::ParsingOptions { allow_dtd: true, ..roxmltree::ParsingOptions::default() };
        roxmltree::Document::parse_with_options(svg, options).expect("well-formed XML")
    }

    /// The `<title>` of every frame.
    fn frame_titles(svg: &str) -> Vec<String> {
        let doc = parse(svg);
        doc.descendants()
            .filter(|n| n.has_tag_name("g") && n.children().any(|c| c.has_tag_name("rect")))
            .filter_map(|g| g.children().find(|c| c.has_tag_name("title")).and_then(|t| t.text()).map(str::to_string))
            .collect()
    }

    #[test]
    fn one_frame_per_stack_node() {
        let roots = vec![
            node("app (1)", 1000, vec![node("main", 1000, vec![node("a", 300, vec![]), node("b", 1, vec![])])]),
            node("other (2)", 10, vec![node("c", 10, vec![])]),
        ];
        let mut out = Vec::new();
        write(&roots, &mut out).unwrap();
        let svg = String::from_utf8(out).unwrap();
        let titles = frame_titles(&svg);
        // The six nodes, and inferno's "all".
        assert_eq!(titles.len(), 7, "{titles:?}");
        for name in ["all", "app (1)", "main", "a", "b", "other (2)", "c"] {
            assert_eq!(titles.iter().filter(|t| t.starts_with(&format!("{name} ("))).count(), 1, "{name}: {titles:?}");
        }
    }

    #[test]
    fn an_empty_graph_is_still_an_svg() {
        let mut out = Vec::new();
        write(&[], &mut out).unwrap();
        assert_eq!(frame_titles(&String::from_utf8(out).unwrap()).len(), 2, "all and (none)");
    }
}
