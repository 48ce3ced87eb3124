//! Output formats: human tables by default, `-o json` / `-o yaml` for
//! scripts (stable: the API's own JSON), `-o wide` for more columns.

use chrono::{DateTime, Utc};
use clap::ValueEnum;
use serde::Serialize;

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, ValueEnum)]
pub enum Format {
    #[default]
    Table,
    Wide,
    Json,
    Yaml,
}

/// Prints a value as JSON or YAML; returns false for table formats so the
/// caller prints its table.
pub fn print_structured<T: Serialize>(format: Format, value: &T) -> anyhow::Result<bool> {
    match format {
        Format::Json => {
            println!("{}", serde_json::to_string_pretty(value)?);
            Ok(true)
        }
        Format::Yaml => {
            print!("{}", serde_yaml_ng::to_string(value)?);
            Ok(true)
        }
        Format::Table | Format::Wide => Ok(false),
    }
}

/// A plain aligned table, like `kubectl get`.
#[derive(Debug)]
pub struct Table {
    rows: Vec<Vec<String>>,
}

impl Table {
    pub fn new(headers: &[&str]) -> Self {
        Table {
            rows: vec![headers.iter().map(|h| h.to_string()).collect()],
        }
    }

    pub fn row(&mut self, cells: Vec<String>) {
        self.rows.push(cells);
    }

    /// Writes `KIND/` before each name in column `column` (`get all`).
    pub fn prefix_names(&mut self, kind: &str, column: usize) {
        for row in self.rows.iter_mut().skip(1) {
            if let Some(name) = row.get_mut(column) {
                *name = format!("{kind}/{name}");
            }
        }
    }

    pub fn print(&self) {
        print!("{}", self.render());
    }

    pub fn render(&self) -> String {
        let widths = self.widths();
        self.rows
            .iter()
            .map(|row| render_row(row, &widths))
            .collect()
    }

    /// Each column's width: its widest cell.
    pub fn widths(&self) -> Vec<usize> {
        let columns = self.rows.iter().map(Vec::len).max().unwrap_or(0);
        (0..columns)
            .map(|c| {
                self.rows
                    .iter()
                    .map(|r| r.get(c).map_or(0, |s| s.chars().count()))
                    .max()
                    .unwrap_or(0)
            })
            .collect()
    }
}

/// One line of a table: every cell but the last padded to its column's
/// width (a wider cell pushes the rest of its line right).
pub fn render_row(row: &[String], widths: &[usize]) -> String {
    let mut line = String::new();
    for (index, cell) in row.iter().enumerate() {
        if index + 1 == row.len() {
            line.push_str(cell);
        } else {
            let width = widths.get(index).copied().unwrap_or(0);
            line.push_str(&format!("{cell:<width$}   "));
        }
    }
    let mut line = line.trim_end().to_string();
    line.push('\n');
    line
}

/// `5s`, `3m`, `2h`, `4d` since `time`.
pub fn age(time: Option<DateTime<Utc>>, now: DateTime<Utc>) -> String {
    let Some(time) = time else {
        return "-".into();
    };
    let seconds = (now - time).num_seconds().max(0);
    match seconds {
        s if s < 120 => format!("{s}s"),
        s if s < 2 * 3600 => format!("{}m", s / 60),
        s if s < 2 * 86_400 => format!("{}h", s / 3600),
        s => format!("{}d", s / 86_400),
    }
}

/// A timestamp for tables: local-agnostic RFC 3339 to the second.
pub fn timestamp(time: DateTime<Utc>) -> String {
    time.format("%Y-%m-%dT%H:%M:%SZ").to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tables_align_columns() {
        let mut table = Table::new(&["NAME", "REVISION"]);
        table.row(vec!["web".into(), "2".into()]);
        table.row(vec!["database".into(), "10".into()]);
        assert_eq!(
            table.render(),
            "NAME       REVISION\nweb        2\ndatabase   10\n"
        );
    }

    #[test]
    fn ages_read_naturally() {
        let now = Utc::now();
        assert_eq!(age(Some(now - chrono::Duration::seconds(5)), now), "5s");
        assert_eq!(age(Some(now - chrono::Duration::minutes(5)), now), "5m");
        assert_eq!(age(Some(now - chrono::Duration::hours(5)), now), "5h");
        assert_eq!(age(Some(now - chrono::Duration::days(5)), now), "5d");
        assert_eq!(age(None, now), "-");
    }
}
