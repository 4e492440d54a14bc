//! Text tables for people (`report`, `top`): columns padded to their widest cell, two spaces
//! apart, names left-aligned and numbers right-aligned. Laid out
//! by `comfy-table` (without its terminal features: no colour codes and no wrapping, so a table
//! piped to a file is the same as on the screen). A cell's control characters are escaped before
//! the columns are measured ([`crate::printable`]), so a hostile name neither acts on the terminal
//! nor shifts the columns.

use comfy_table::{CellAlignment, Table, presets};

use crate::printable::escape_controls;

/// The table of `rows` under `header`, one line each, the columns `left` says (by index)
/// left-aligned; every line ends with a newline and no trailing space.
pub fn render(header: &[&str], rows: &[Vec<String>], left: impl Fn(usize) -> bool) -> String {
    let mut table = Table::new();
    table
        .load_style(presets::NOTHING)
        .set_header(header.to_vec())
        .add_rows(rows.iter().map(|row| row.iter().map(|cell| escape_controls(cell).into_owned())));
    let last = header.len().saturating_sub(1);
    for (i, column) in table.column_iter_mut().enumerate() {
        column.set_padding((0, if i < last { 2 } else { 0 }));
        column.set_cell_alignment(if left(i) { CellAlignment::Left } else { CellAlignment::Right });
    }
    let mut text = table.trim_fmt();
    text.push('\n');
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_left_numbers_right_two_spaces_apart() {
        let rows = vec![
            vec!["main".to_string(), "1".to_string(), "2.5 ms".to_string()],
            vec!["fib".to_string(), "177".to_string(), "900 µs".to_string()],
        ];
        assert_eq!(
            render(&["function", "calls", "total"], &rows, |i| i == 0),
            "function  calls   total\nmain          1  2.5 ms\nfib         177  900 µs\n"
        );
    }

    #[test]
    fn control_characters_are_escaped_before_the_columns_are_measured() {
        let rows = vec![vec!["f\x1b[2J".to_string(), "1".to_string()], vec!["main".to_string(), "2".to_string()]];
        assert_eq!(
            render(&["function", "calls"], &rows, |i| i == 0),
            "function    calls\nf\\u{1b}[2J      1\nmain            2\n"
        );
    }

    #[test]
    fn a_table_with_no_rows_is_its_header() {
        assert_eq!(render(&["pid", "process"], &[], |_| true), "pid  process\n");
    }
}
