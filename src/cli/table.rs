//! Plain-text tables for operator output: padded columns, numbers right-aligned.
//!
//! A thin face over comfy-table, so the callers keep `Table::new(columns)`,
//! `push(row)` and `Display`. The crate measures cells by their display width
//! (a CJK name or an emoji takes two columns), which counting `char`s did not.

use std::fmt;

use comfy_table::{CellAlignment, ContentArrangement, presets};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Align {
    Left,
    Right,
}

/// Columns two spaces apart, no borders, no trailing blanks; never wrapped.
#[derive(Debug)]
pub(crate) struct Table(comfy_table::Table);

impl Table {
    pub fn new(columns: &[(&'static str, Align)]) -> Table {
        let mut table = comfy_table::Table::new();
        table
            .load_style(presets::NOTHING)
            .set_content_arrangement(ContentArrangement::Disabled)
            .set_header(columns.iter().map(|(name, _)| *name));
        for (i, column) in table.column_iter_mut().enumerate() {
            let (_, align) = columns[i];
            column.set_cell_alignment(match align {
                Align::Left => CellAlignment::Left,
                Align::Right => CellAlignment::Right,
            });
            // One space each side makes two between columns; none before the first.
            column.set_padding((u16::from(i > 0), 1));
        }
        Table(table)
    }

    pub fn push(&mut self, row: Vec<String>) {
        self.0.add_row(row);
    }
}

/// A `list` command's output: `rows` as pretty JSON with `--json`, `empty`
/// when there are none, else a table of `columns` with a row per item.
pub(crate) fn print_list<T: serde::Serialize>(
    rows: &[T],
    json: bool,
    empty: &str,
    columns: &[(&'static str, Align)],
    row: impl Fn(&T) -> Vec<String>,
) -> anyhow::Result<()> {
    if json {
        println!("{}", serde_json::to_string_pretty(rows)?);
    } else if rows.is_empty() {
        println!("{empty}");
    } else {
        let mut table = Table::new(columns);
        for item in rows {
            table.push(row(item));
        }
        print!("{table}");
    }
    Ok(())
}

impl fmt::Display for Table {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for line in self.0.lines() {
            writeln!(f, "{}", line.trim_end())?;
        }
        Ok(())
    }
}

/// A secret made or set for a row (an endpoint's, a source's), printed once:
/// with `--json` as `{"id","name","secret"}`, else as a line and `hint`, who
/// the secret is for; `show` false prints nothing in text (a secret the
/// operator gave).
pub(crate) fn print_secret(
    id: i64,
    name: &str,
    secret: &str,
    json: bool,
    show: bool,
    hint: &str,
) -> anyhow::Result<()> {
    #[derive(serde::Serialize)]
    struct SecretJson<'a> {
        id: i64,
        name: &'a str,
        secret: &'a str,
    }
    if json {
        println!(
            "{}",
            serde_json::to_string(&SecretJson { id, name, secret })?
        );
    } else if show {
        println!("secret: {secret}");
        println!("{hint}");
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn columns_are_padded_and_numbers_right_aligned() {
        let mut table = Table::new(&[("KIND", Align::Left), ("N", Align::Right)]);
        table.push(vec!["noop".into(), "7".into()]);
        table.push(vec!["receipt_pdf".into(), "12".into()]);
        assert_eq!(
            table.to_string(),
            "KIND          N\nnoop          7\nreceipt_pdf  12\n"
        );
    }

    #[test]
    fn wide_characters_are_padded_by_their_display_width() {
        let mut table = Table::new(&[("KEY", Align::Left), ("N", Align::Right)]);
        table.push(vec!["注文".into(), "1".into()]);
        table.push(vec!["order".into(), "22".into()]);
        assert_eq!(table.to_string(), "KEY     N\n注文    1\norder  22\n");
    }

    #[test]
    fn short_rows_leave_their_last_cells_blank() {
        let mut table = Table::new(&[("A", Align::Left), ("B", Align::Left), ("C", Align::Right)]);
        table.push(vec!["x".into()]);
        assert_eq!(table.to_string(), "A  B  C\nx\n");
    }
}
