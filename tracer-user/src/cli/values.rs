//! Command-line values for the library's own enums: clap stays in the binary, so the library's
//! types carry their names (`Format::name`, `SortColumn::name`) and these parsers list them.

use clap::builder::{PossibleValue, PossibleValuesParser, TypedValueParser};
use tracer_user::{analysis::stats::SortColumn, export::Format};

/// `--format NAME`, listing every format with what it is.
pub fn format() -> impl TypedValueParser<Value = Format> {
    PossibleValuesParser::new(Format::ALL.map(|f| PossibleValue::new(f.name()).help(f.summary())))
        .map(|name| Format::ALL.into_iter().find(|f| f.name() == name).expect("clap checked the name"))
}

/// `--sort COLUMN`.
pub fn sort_column() -> impl TypedValueParser<Value = SortColumn> {
    PossibleValuesParser::new(SortColumn::ALL.map(|c| PossibleValue::new(c.name())))
        .map(|name| SortColumn::ALL.into_iter().find(|c| c.name() == name).expect("clap checked the name"))
}
