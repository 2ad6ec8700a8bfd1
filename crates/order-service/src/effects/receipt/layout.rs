//! Where each part of an order goes on the receipt's pages: columns sized to
//! their cells, rows flowed onto further pages, the total kept with its note.

use chrono::{DateTime, Utc};

use super::ReceiptSettings;
use super::canvas::{Align, Canvas, Draw};
use super::fonts::Fonts;
use super::style::*;
use crate::orders::{Currency, Order, OrderItem};

/// Right edges of the number columns, sized to their widest cell.
pub(super) struct Columns {
    name_width: f32,
    /// Amounts so wide that names get no room beside them: each name takes the
    /// full width and its numbers go on the line below.
    stacked: bool,
    qty_right: f32,
    unit_right: f32,
    amount_right: f32,
}

pub(super) struct Row {
    name_lines: Vec<String>,
    sku: String,
    quantity: String,
    unit_price: String,
    line_total: String,
}

/// First baseline of a row below its top edge.
pub(super) const ROW_FIRST_BASELINE: f32 = 12.0;
/// Space under the SKU line before the next row's top edge.
pub(super) const ROW_PAD: f32 = 5.0;

impl Row {
    /// From the row's top edge to the next row's.
    fn height(&self, columns: &Columns) -> f32 {
        let lines = self.name_lines.len() + usize::from(columns.stacked);
        ROW_FIRST_BASELINE + lines.saturating_sub(1) as f32 * LINE + SMALL_LINE + ROW_PAD
    }
}

pub(super) fn layout(
    order: &Order,
    settings: &ReceiptSettings,
    currency: Currency,
    fonts: &Fonts,
) -> Vec<Vec<Draw>> {
    let mut canvas = Canvas::new(fonts);
    let cells: Vec<(&OrderItem, String, String, String)> = order
        .items
        .iter()
        .map(|item| {
            (
                item,
                item.quantity.to_string(),
                currency.format(item.unit_price_cents),
                currency.format(item.line_total_cents()),
            )
        })
        .collect();
    let total = currency.format(order.total_cents);
    let widest = |header: &str, values: &mut dyn Iterator<Item = &str>| {
        values
            .map(|v| fonts.width(TEXT, v))
            .fold(fonts.width(STRONG, header), f32::max)
    };
    // The total is set larger and bold in the amount column: it must fit too.
    let amount_w =
        widest("Amount", &mut cells.iter().map(|c| c.3.as_str())).max(fonts.width(TOTAL, &total));
    let unit_w = widest("Unit price", &mut cells.iter().map(|c| c.2.as_str()));
    let qty_w = widest("Qty", &mut cells.iter().map(|c| c.1.as_str()));
    let amount_right = RIGHT;
    let unit_right = amount_right - amount_w - COLUMN_GAP;
    let qty_right = unit_right - unit_w - COLUMN_GAP;
    let beside = qty_right - qty_w - COLUMN_GAP - LEFT;
    let stacked = beside < MIN_NAME_WIDTH;
    let columns = Columns {
        name_width: if stacked { RIGHT - LEFT } else { beside },
        stacked,
        qty_right,
        unit_right,
        amount_right,
    };

    let rows: Vec<Row> = cells
        .iter()
        .map(|(item, quantity, unit_price, line_total)| Row {
            name_lines: canvas.wrap(TEXT, &item.name, columns.name_width),
            sku: item.sku.clone(),
            quantity: quantity.clone(),
            unit_price: unit_price.clone(),
            line_total: line_total.clone(),
        })
        .collect();

    let baseline = header(&mut canvas, order, settings);
    let mut top = table_header(&mut canvas, &columns, baseline);
    let mut first_on_page = true;
    for row in &rows {
        if top - row.height(&columns) < BOTTOM {
            canvas.new_page();
            let baseline = continuation_header(&mut canvas, order, settings);
            top = table_header(&mut canvas, &columns, baseline);
            first_on_page = true;
        }
        if !first_on_page {
            canvas.rule(top, 0.25);
        }
        item_row(&mut canvas, &columns, row, top);
        top -= row.height(&columns);
        first_on_page = false;
    }

    let note = format!(
        "All amounts in {} ({}). Thank you for your order.",
        currency.code(),
        match currency.minor_units() {
            0 => "no minor unit".to_owned(),
            1 => "1 decimal place".to_owned(),
            n => format!("{n} decimal places"),
        }
    );
    let note_lines = canvas.wrap(NOTE, &note, RIGHT - LEFT);
    // The total and its closing note stay together.
    let closing_height = 18.0 + 2.0 * LINE + note_lines.len() as f32 * SMALL_LINE;
    if top - closing_height < BOTTOM {
        canvas.new_page();
        top = continuation_header(&mut canvas, order, settings) + LINE;
    }
    canvas.rule(top, 0.8);
    let mut y = top - 18.0;
    canvas.text(TOTAL, columns.unit_right, y, Align::Right, "Total");
    canvas.text(TOTAL, columns.amount_right, y, Align::Right, &total);
    y -= 2.0 * LINE;
    for line in note_lines {
        canvas.text(NOTE, LEFT, y, Align::Left, &line);
        y -= SMALL_LINE;
    }
    canvas.pages
}

/// The first page's heading: shop, title and the order's facts. Returns the
/// baseline for the table header.
pub(super) fn header(canvas: &mut Canvas<'_>, order: &Order, settings: &ReceiptSettings) -> f32 {
    let mut y = TOP - 14.0;
    let title = "RECEIPT";
    let title_w = canvas.fonts.width(TITLE, title);
    let shop_lines = canvas.wrap(
        SHOP,
        &settings.shop_name,
        RIGHT - LEFT - title_w - COLUMN_GAP,
    );
    canvas.text(TITLE, RIGHT, y, Align::Right, title);
    for line in &shop_lines {
        canvas.text(SHOP, LEFT, y, Align::Left, line);
        y -= 20.0;
    }
    y -= 14.0;

    let value_x = LEFT + 28.0 * MM;
    let value_width = RIGHT - value_x;
    let facts = [
        ("Order", STRONG, format!("#{}", order.id)),
        ("Date", TEXT, format_date(order.created_at)),
        ("Customer", TEXT, order.customer_name.clone()),
        ("Email", TEXT, order.customer_email.clone()),
    ];
    for (label, value_style, value) in facts {
        canvas.text(LABEL, LEFT, y, Align::Left, label);
        for line in canvas.wrap(value_style, &value, value_width) {
            canvas.text(value_style, value_x, y, Align::Left, &line);
            y -= LINE + 2.0;
        }
    }
    y - 2.0 * LINE
}

/// The heading of every later page. Returns the baseline for the table header.
pub(super) fn continuation_header(
    canvas: &mut Canvas<'_>,
    order: &Order,
    settings: &ReceiptSettings,
) -> f32 {
    let mut y = TOP - 10.0;
    let heading = format!("{} · Order #{} (continued)", settings.shop_name, order.id);
    for line in canvas.wrap(CONTINUED, &heading, RIGHT - LEFT) {
        canvas.text(CONTINUED, LEFT, y, Align::Left, &line);
        y -= LINE;
    }
    y - 2.0 * LINE
}

/// Column titles at `baseline`, ruled below. Returns the top edge of the first row.
pub(super) fn table_header(canvas: &mut Canvas<'_>, columns: &Columns, baseline: f32) -> f32 {
    let titles = [
        (LEFT, Align::Left, "Item"),
        (columns.qty_right, Align::Right, "Qty"),
        (columns.unit_right, Align::Right, "Unit price"),
        (columns.amount_right, Align::Right, "Amount"),
    ];
    for (x, align, title) in titles {
        canvas.text(STRONG, x, baseline, align, title);
    }
    canvas.rule(baseline - 5.0, 0.8);
    baseline - 5.0
}

pub(super) fn item_row(canvas: &mut Canvas<'_>, columns: &Columns, row: &Row, top: f32) {
    let y = top - ROW_FIRST_BASELINE;
    let numbers_y = if columns.stacked {
        y - row.name_lines.len() as f32 * LINE
    } else {
        y
    };
    let numbers = [
        (columns.qty_right, &row.quantity),
        (columns.unit_right, &row.unit_price),
        (columns.amount_right, &row.line_total),
    ];
    for (x, value) in numbers {
        canvas.text(TEXT, x, numbers_y, Align::Right, value);
    }
    let mut line_y = y;
    for line in &row.name_lines {
        canvas.text(TEXT, LEFT, line_y, Align::Left, line);
        line_y -= LINE;
    }
    if columns.stacked {
        line_y -= LINE;
    }
    let sku_y = line_y + LINE - SMALL_LINE;
    canvas.text(NOTE, LEFT, sku_y, Align::Left, &row.sku);
}

pub(super) fn format_date(at: DateTime<Utc>) -> String {
    at.format("%-d %B %Y, %H:%M UTC").to_string()
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeSet;

    use super::super::fixtures::*;
    use super::*;

    #[test]
    fn everything_drawn_stays_inside_the_margins_even_with_huge_amounts_and_long_names() {
        let long_word = "Überlangesproduktbezeichnungswort".repeat(6);
        let order = sample(
            1,
            &"Παπαδόπουλος-Иванова ".repeat(9),
            "USD",
            vec![
                item("A", &long_word, 10_000, 1_000_000_000_000),
                item("B", &"word ".repeat(40), 1, 0),
            ],
        );
        let pages = layout(
            &order,
            &ReceiptSettings::default(),
            currency("USD"),
            fonts(),
        );
        for (page, style, x, y, text) in texts(&pages) {
            let right = x + fonts().width(style, text);
            assert!(
                x >= LEFT - 0.01 && right <= RIGHT + 0.01,
                "page {page}: {text:?} spans {x}..{right}"
            );
            assert!(
                (FOOTER_Y - 0.01..=TOP).contains(&y),
                "page {page}: {text:?} at y={y}"
            );
        }
        assert_no_overlaps(&pages);
    }

    #[test]
    fn amounts_are_right_aligned_on_one_edge() {
        let order = sample(
            9,
            "Ada",
            "JPY",
            vec![item("A", "One", 1, 5), item("B", "Two", 12, 123_456)],
        );
        let pages = layout(
            &order,
            &ReceiptSettings::default(),
            currency("JPY"),
            fonts(),
        );
        let amounts: Vec<f32> = texts(&pages)
            .filter(|(_, _, _, _, text)| text.ends_with(" JPY"))
            .map(|(_, style, x, _, text)| x + fonts().width(style, text))
            .collect();
        assert!(amounts.len() >= 5, "{amounts:?}");
        assert_no_overlaps(&pages);
        let edges: BTreeSet<i64> = amounts.iter().map(|r| (r * 10.0).round() as i64).collect();
        assert!(
            edges.len() <= 2,
            "unit price and amount columns only: {amounts:?}"
        );
        assert!(texts(&pages).any(|t| t.4 == "1,481,472 JPY"));
    }

    #[test]
    fn long_cjk_names_without_spaces_wrap_inside_the_margins() {
        let order = sample(
            11,
            &"山田太郎".repeat(30),
            "JPY",
            vec![item(
                "A",
                &"京都宇治産の最高級抹茶を使用した和菓子".repeat(8),
                1,
                1200,
            )],
        );
        let pages = layout(
            &order,
            &ReceiptSettings::default(),
            currency("JPY"),
            fonts(),
        );
        for (page, style, x, _, text) in texts(&pages) {
            let right = x + fonts().width(style, text);
            assert!(
                x >= LEFT - 0.01 && right <= RIGHT + 0.01,
                "page {page}: {text:?} spans {x}..{right}"
            );
        }
        assert_no_overlaps(&pages);
    }
}
