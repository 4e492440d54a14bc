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

/// The one syntax of every duration option: a number with a unit (`500ns`, `20us`, `250ms`,
/// `1.5s`, `2m`, `1h`), or a bare number of seconds (`1.5`). Not humantime's parser: it refuses
/// the fractions people type (`1.5ms`), and its units are not needed beyond these.
pub fn duration(s: &str) -> Result<std::time::Duration, String> {
    let text = s.trim();
    let split = text.find(|c: char| !(c.is_ascii_digit() || c == '.')).unwrap_or(text.len());
    let (number, unit) = text.split_at(split);
    let seconds_per_unit = match unit.trim() {
        "" | "s" => 1.0,
        "ns" => 1e-9,
        "us" | "µs" => 1e-6,
        "ms" => 1e-3,
        "m" | "min" => 60.0,
        "h" => 3600.0,
        other => {
            return Err(format!("'{other}' is not a unit of time (ns, us, ms, s, m, h; a bare number is seconds)"));
        }
    };
    let value: f64 = number.parse().map_err(|_| format!("'{s}' is not a duration (e.g. 1.5, 250ms, 2s)"))?;
    std::time::Duration::try_from_secs_f64(value * seconds_per_unit)
        .map_err(|_| format!("'{s}' is not a duration (e.g. 1.5, 250ms, 2s)"))
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::duration;

    #[test]
    fn one_duration_syntax() {
        for (text, expected) in [
            ("1.5", Duration::from_millis(1500)),
            ("2", Duration::from_secs(2)),
            ("1s", Duration::from_secs(1)),
            ("250ms", Duration::from_millis(250)),
            ("1.5ms", Duration::from_micros(1500)),
            ("20us", Duration::from_micros(20)),
            ("20µs", Duration::from_micros(20)),
            ("500ns", Duration::from_nanos(500)),
            ("2m", Duration::from_secs(120)),
            ("1h", Duration::from_secs(3600)),
            ("0", Duration::ZERO),
        ] {
            assert_eq!(duration(text), Ok(expected), "{text}");
        }
        for bad in ["soon", "1d", "-1", "1.2.3s", "", "ms"] {
            assert!(duration(bad).is_err(), "{bad}");
        }
        assert_eq!(
            duration("3 weeks").unwrap_err(),
            "'weeks' is not a unit of time (ns, us, ms, s, m, h; a bare number is seconds)"
        );
    }
}
