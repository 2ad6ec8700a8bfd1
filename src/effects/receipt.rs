//! receipt_pdf: an order rendered as a printable A4 PDF receipt.
//!
//! The layout is done by hand with printpdf's page operations. Text is measured
//! with the embedded font's advance widths, which is what lets amounts be
//! right-aligned, columns be sized to their widest cell and long item names be
//! wrapped instead of running into the numbers.
//!
//! DejaVu Sans is embedded (`templates/fonts/`, with its licence) because the
//! PDF base-14 fonts only cover Latin-1: a Cyrillic or Greek customer name would
//! print as boxes. Chinese, Japanese and Korean come from a CJK font, character
//! by character (see `receipt/fonts.rs`). The stored receipt is written by the completer
//! in the same transaction that marks the job done (see `outbox::finish`), not here.

mod fonts;
mod store;

pub use store::store_receipt;

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;
use std::sync::Arc;

use chrono::{DateTime, Utc};
use printpdf::{
    Color, FontId, Greyscale, Line, LinePoint, Mm, Op, PdfDocument, PdfFontHandle, PdfPage,
    PdfSaveOptions, Point, Pt, TextItem, TextRenderingMode,
};

pub use self::fonts::{DEFAULT_CJK_FONT_PATH, FontError};
use self::fonts::{Face, Fonts, Program};
use super::EffectError;
use crate::orders::{Currency, Order, OrderItem};

#[derive(Debug, Clone)]
pub struct ReceiptSettings {
    /// Printed at the top of every receipt and in its footer.
    pub shop_name: String,
    /// `None`: the process-wide default fonts, loaded at the first receipt
    /// (DejaVu, and the CJK font at [`DEFAULT_CJK_FONT_PATH`] if installed).
    fonts: Option<Arc<Fonts>>,
}

impl Default for ReceiptSettings {
    fn default() -> Self {
        ReceiptSettings {
            shop_name: "Outbox Relay Demo Shop".to_owned(),
            fonts: None,
        }
    }
}

impl ReceiptSettings {
    /// Receipts with the CJK font at `path` (`RECEIPT_FONT_PATH`), read and
    /// checked now, so that a bad path stops the process at start.
    pub fn with_cjk_font(path: &Path) -> Result<ReceiptSettings, FontError> {
        Ok(ReceiptSettings {
            fonts: Some(Arc::new(Fonts::with_cjk_font(path)?)),
            ..ReceiptSettings::default()
        })
    }

    /// Loads the default fonts now rather than at the first receipt, so that a
    /// missing CJK font is reported at start. Returns the CJK font's path.
    pub fn preload(&self) -> Result<Option<&Path>, String> {
        Ok(self.fonts()?.cjk_path())
    }

    fn fonts(&self) -> Result<&Fonts, String> {
        match &self.fonts {
            Some(fonts) => Ok(fonts),
            None => fonts::default_fonts().map(|f| &**f),
        }
    }
}

/// Renders `order` as a PDF. Rendering is deterministic in its input, so every
/// failure is [`EffectError::Permanent`]: another attempt would fail the same way.
pub fn render_receipt(order: &Order, settings: &ReceiptSettings) -> Result<Vec<u8>, EffectError> {
    let fonts = settings
        .fonts()
        .map_err(|e| EffectError::permanent(format!("receipt font: {e}")))?;
    let currency = Currency::parse(&order.currency).ok_or_else(|| {
        EffectError::permanent(format!(
            "order {} has an unknown currency {:?}",
            order.id, order.currency
        ))
    })?;
    let pages = layout(order, settings, currency, fonts);
    Ok(emit(order, settings, fonts, pages))
}

// ---------------------------------------------------------------------------
// Fonts

impl Fonts {
    fn width(&self, style: Style, text: &str) -> f32 {
        self.measure(style.face, style.size, text)
    }
}

// ---------------------------------------------------------------------------
// Geometry (points; PDF's origin is the bottom-left corner)

const MM: f32 = 72.0 / 25.4;
const PAGE_W_MM: f32 = 210.0;
const PAGE_H_MM: f32 = 297.0;
const PAGE_W: f32 = PAGE_W_MM * MM;
const PAGE_H: f32 = PAGE_H_MM * MM;
const LEFT: f32 = 20.0 * MM;
const RIGHT: f32 = PAGE_W - 20.0 * MM;
const TOP: f32 = PAGE_H - 20.0 * MM;
/// Lowest baseline for table content; the footer lives below it.
const BOTTOM: f32 = 25.0 * MM;
const FOOTER_Y: f32 = 12.0 * MM;

const BODY: f32 = 10.0;
const SMALL: f32 = 8.0;
const LINE: f32 = 13.0;
const SMALL_LINE: f32 = 10.5;
const COLUMN_GAP: f32 = 14.0;
/// Narrower than this and names go above their numbers instead of beside them.
const MIN_NAME_WIDTH: f32 = 45.0 * MM;
const GREY: f32 = 0.4;
/// Outline width of synthetic bold, as a share of the text size.
const SYNTHETIC_BOLD_STROKE: f32 = 0.035;

/// How a piece of text is set.
#[derive(Debug, Clone, Copy, PartialEq)]
struct Style {
    face: Face,
    size: f32,
    grey: bool,
}

const fn style(face: Face, size: f32, grey: bool) -> Style {
    Style { face, size, grey }
}

const TEXT: Style = style(Face::Regular, BODY, false);
const LABEL: Style = style(Face::Regular, BODY, true);
const STRONG: Style = style(Face::Bold, BODY, false);
const NOTE: Style = style(Face::Regular, SMALL, true);
const TOTAL: Style = style(Face::Bold, 12.0, false);
const SHOP: Style = style(Face::Bold, 16.0, false);
const TITLE: Style = style(Face::Bold, 16.0, true);
const CONTINUED: Style = style(Face::Bold, 11.0, false);

#[derive(Debug, Clone, Copy)]
enum Align {
    Left,
    Right,
}

/// One thing drawn on a page, before fonts are registered with the document.
#[derive(Debug, Clone)]
enum Draw {
    Text {
        style: Style,
        x: f32,
        y: f32,
        text: String,
    },
    Rule {
        y: f32,
        thickness: f32,
    },
}

/// Places text and rules, page by page.
struct Canvas<'f> {
    fonts: &'f Fonts,
    pages: Vec<Vec<Draw>>,
}

impl<'f> Canvas<'f> {
    fn new(fonts: &'f Fonts) -> Self {
        Canvas {
            fonts,
            pages: vec![Vec::new()],
        }
    }

    fn new_page(&mut self) {
        self.pages.push(Vec::new());
    }

    fn push(&mut self, draw: Draw) {
        if let Some(page) = self.pages.last_mut() {
            page.push(draw);
        }
    }

    fn text(&mut self, style: Style, x: f32, y: f32, align: Align, text: &str) {
        let x = match align {
            Align::Left => x,
            Align::Right => x - self.fonts.width(style, text),
        };
        self.push(Draw::Text {
            style,
            x,
            y,
            text: text.to_owned(),
        });
    }

    fn rule(&mut self, y: f32, thickness: f32) {
        self.push(Draw::Rule { y, thickness });
    }

    /// Splits `text` into lines no wider than `max_width`: at spaces where it
    /// can, inside a word only when the word alone is too wide.
    fn wrap(&self, style: Style, text: &str, max_width: f32) -> Vec<String> {
        let fits = |s: &str| self.fonts.width(style, s) <= max_width;
        let mut lines = Vec::new();
        let mut current = String::new();
        for word in text.split_whitespace() {
            let candidate = if current.is_empty() {
                word.to_owned()
            } else {
                format!("{current} {word}")
            };
            if fits(&candidate) {
                current = candidate;
                continue;
            }
            if !current.is_empty() {
                lines.push(std::mem::take(&mut current));
            }
            for ch in word.chars() {
                current.push(ch);
                if !fits(&current) && current.chars().count() > 1 {
                    current.pop();
                    lines.push(std::mem::take(&mut current));
                    current.push(ch);
                }
            }
        }
        if !current.is_empty() || lines.is_empty() {
            lines.push(current);
        }
        lines
    }
}

/// Right edges of the number columns, sized to their widest cell.
struct Columns {
    name_width: f32,
    /// Amounts so wide that names get no room beside them: each name takes the
    /// full width and its numbers go on the line below.
    stacked: bool,
    qty_right: f32,
    unit_right: f32,
    amount_right: f32,
}

struct Row {
    name_lines: Vec<String>,
    sku: String,
    quantity: String,
    unit_price: String,
    line_total: String,
}

/// First baseline of a row below its top edge.
const ROW_FIRST_BASELINE: f32 = 12.0;
/// Space under the SKU line before the next row's top edge.
const ROW_PAD: f32 = 5.0;

impl Row {
    /// From the row's top edge to the next row's.
    fn height(&self, columns: &Columns) -> f32 {
        let lines = self.name_lines.len() + usize::from(columns.stacked);
        ROW_FIRST_BASELINE + lines.saturating_sub(1) as f32 * LINE + SMALL_LINE + ROW_PAD
    }
}

fn layout(
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
fn header(canvas: &mut Canvas<'_>, order: &Order, settings: &ReceiptSettings) -> f32 {
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
fn continuation_header(canvas: &mut Canvas<'_>, order: &Order, settings: &ReceiptSettings) -> f32 {
    let mut y = TOP - 10.0;
    let heading = format!("{} · Order #{} (continued)", settings.shop_name, order.id);
    for line in canvas.wrap(CONTINUED, &heading, RIGHT - LEFT) {
        canvas.text(CONTINUED, LEFT, y, Align::Left, &line);
        y -= LINE;
    }
    y - 2.0 * LINE
}

/// Column titles at `baseline`, ruled below. Returns the top edge of the first row.
fn table_header(canvas: &mut Canvas<'_>, columns: &Columns, baseline: f32) -> f32 {
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

fn item_row(canvas: &mut Canvas<'_>, columns: &Columns, row: &Row, top: f32) {
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

fn format_date(at: DateTime<Utc>) -> String {
    at.format("%-d %B %Y, %H:%M UTC").to_string()
}

// ---------------------------------------------------------------------------
// PDF output

fn emit(
    order: &Order,
    settings: &ReceiptSettings,
    fonts: &Fonts,
    pages: Vec<Vec<Draw>>,
) -> Vec<u8> {
    let count = pages.len();
    let pages: Vec<Vec<Draw>> = pages
        .into_iter()
        .enumerate()
        .map(|(index, mut draws)| {
            draws.extend(footer(order, settings, fonts, index, count));
            draws
        })
        .collect();

    let mut doc = PdfDocument::new(&format!("Receipt for order #{}", order.id));
    doc.metadata.info.author = settings.shop_name.clone();
    doc.metadata.info.creator = concat!("outbox-relay ", env!("CARGO_PKG_VERSION")).to_owned();
    if let Ok(created) = printpdf::DateTime::from_unix_timestamp(order.created_at.timestamp()) {
        doc.metadata.info.creation_date = created;
        doc.metadata.info.modification_date = created;
        doc.metadata.info.metadata_date = created;
    }
    // Each font program embeds only the characters it draws; one a receipt
    // does not use (the CJK font, on most) is not embedded at all.
    let mut used: BTreeMap<Program, BTreeSet<char>> = BTreeMap::new();
    for draw in pages.iter().flatten() {
        if let Draw::Text { style, text, .. } = draw {
            for (program, run) in fonts.runs(style.face, text) {
                used.entry(program).or_default().extend(run.chars());
            }
        }
    }
    let font_ids: BTreeMap<Program, FontId> = used
        .iter()
        .map(|(program, chars)| {
            (
                *program,
                doc.add_font(&fonts.subset_or_whole(*program, chars)),
            )
        })
        .collect();

    let pdf_pages = pages
        .iter()
        .map(|draws| {
            let mut ops = Vec::with_capacity(draws.len() * 6);
            for draw in draws {
                match draw {
                    Draw::Text { style, x, y, text } => {
                        let level = if style.grey { GREY } else { 0.0 };
                        ops.push(Op::SetFillColor {
                            col: grey_color(level),
                        });
                        let mut x = *x;
                        for (program, run) in fonts.runs(style.face, text) {
                            let Some(font) = font_ids.get(&program) else {
                                continue;
                            };
                            // The one CJK face is regular: bold CJK is drawn
                            // filled and outlined, as viewers embolden a font
                            // that lacks a bold face, so it matches DejaVu Bold.
                            let embolden = program == Program::Cjk && style.face == Face::Bold;
                            if embolden {
                                ops.extend([
                                    Op::SetOutlineColor {
                                        col: grey_color(level),
                                    },
                                    Op::SetOutlineThickness {
                                        pt: Pt(style.size * SYNTHETIC_BOLD_STROKE),
                                    },
                                    Op::SetTextRenderingMode {
                                        mode: TextRenderingMode::FillStroke,
                                    },
                                ]);
                            }
                            ops.extend([
                                Op::StartTextSection,
                                Op::SetFont {
                                    font: PdfFontHandle::External(font.clone()),
                                    size: Pt(style.size),
                                },
                                Op::SetTextCursor {
                                    pos: Point {
                                        x: Pt(x),
                                        y: Pt(*y),
                                    },
                                },
                                Op::ShowText {
                                    items: vec![TextItem::Text(run.to_owned())],
                                },
                                Op::EndTextSection,
                            ]);
                            if embolden {
                                ops.push(Op::SetTextRenderingMode {
                                    mode: TextRenderingMode::Fill,
                                });
                            }
                            x += fonts.measure(style.face, style.size, run);
                        }
                    }
                    Draw::Rule { y, thickness } => ops.extend([
                        Op::SetOutlineColor {
                            col: grey_color(if *thickness < 0.5 { 0.75 } else { 0.2 }),
                        },
                        Op::SetOutlineThickness { pt: Pt(*thickness) },
                        Op::DrawLine {
                            line: Line {
                                points: [LEFT, RIGHT]
                                    .map(|x| LinePoint {
                                        p: Point {
                                            x: Pt(x),
                                            y: Pt(*y),
                                        },
                                        bezier: false,
                                    })
                                    .to_vec(),
                                is_closed: false,
                            },
                        },
                    ]),
                }
            }
            PdfPage::new(Mm(PAGE_W_MM), Mm(PAGE_H_MM), ops)
        })
        .collect();
    doc.with_pages(pdf_pages)
        .save(&PdfSaveOptions::default(), &mut Vec::new())
}

fn footer(
    order: &Order,
    settings: &ReceiptSettings,
    fonts: &Fonts,
    index: usize,
    count: usize,
) -> Vec<Draw> {
    let mut canvas = Canvas::new(fonts);
    let page = format!("Page {} of {count}", index + 1);
    let page_w = fonts.width(NOTE, &page);
    let left = canvas
        .wrap(
            NOTE,
            &format!("{} · Order #{}", settings.shop_name, order.id),
            RIGHT - LEFT - page_w - COLUMN_GAP,
        )
        .into_iter()
        .next()
        .unwrap_or_default();
    canvas.text(NOTE, LEFT, FOOTER_Y, Align::Left, &left);
    canvas.text(NOTE, RIGHT, FOOTER_Y, Align::Right, &page);
    canvas.pages.into_iter().flatten().collect()
}

fn grey_color(level: f32) -> Color {
    Color::Greyscale(Greyscale {
        percent: level,
        icc_profile: None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn item(sku: &str, name: &str, quantity: i32, unit_price_cents: i64) -> OrderItem {
        OrderItem {
            id: 0,
            sku: sku.to_owned(),
            name: name.to_owned(),
            quantity,
            unit_price_cents,
        }
    }

    fn sample(id: i64, name: &str, currency: &str, items: Vec<OrderItem>) -> Order {
        Order {
            id,
            customer_email: "customer@example.com".to_owned(),
            customer_name: name.to_owned(),
            currency: currency.to_owned(),
            total_cents: items.iter().map(OrderItem::line_total_cents).sum(),
            status: "placed".to_owned(),
            created_at: DateTime::from_timestamp(1_796_036_700, 0).unwrap_or_default(),
            items,
        }
    }

    fn fonts() -> &'static Fonts {
        fonts::default_fonts().expect("embedded fonts parse")
    }

    fn texts(pages: &[Vec<Draw>]) -> impl Iterator<Item = (usize, Style, f32, f32, &str)> {
        pages.iter().enumerate().flat_map(|(page, draws)| {
            draws.iter().filter_map(move |draw| match draw {
                Draw::Text { style, x, y, text } => Some((page, *style, *x, *y, text.as_str())),
                Draw::Rule { .. } => None,
            })
        })
    }

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

    /// No two pieces of text share ink: boxes from baseline-descent to baseline+ascent.
    fn assert_no_overlaps(pages: &[Vec<Draw>]) {
        let boxes: Vec<_> = texts(pages)
            .filter(|t| !t.4.is_empty())
            .map(|(page, style, x, y, text)| {
                let w = fonts().width(style, text);
                (
                    page,
                    x,
                    x + w,
                    y - 0.2 * style.size,
                    y + 0.75 * style.size,
                    text,
                )
            })
            .collect();
        for (i, a) in boxes.iter().enumerate() {
            for b in &boxes[i + 1..] {
                let overlap = a.0 == b.0 && a.1 < b.2 && b.1 < a.2 && a.3 < b.4 && b.3 < a.4;
                assert!(!overlap, "{:?} overlaps {:?}", a.5, b.5);
            }
        }
    }

    #[test]
    fn many_items_flow_onto_further_pages_and_each_page_is_numbered() {
        let items = (0..100)
            .map(|i| item(&format!("SKU-{i}"), &format!("Item {i}"), 1, 100))
            .collect();
        let order = sample(5, "Zoë Ångström", "EUR", items);
        let pages = layout(
            &order,
            &ReceiptSettings::default(),
            currency("EUR"),
            fonts(),
        );
        assert!(pages.len() >= 3, "{} pages", pages.len());
        assert_no_overlaps(&pages);
        let pdf = render_receipt(&order, &ReceiptSettings::default()).expect("renders");
        let text = pdf_extract::extract_text_from_mem(&pdf).expect("extractable");
        let count = pages.len();
        for page in 1..=count {
            assert!(text.contains(&format!("Page {page} of {count}")), "{text}");
        }
        for i in 0..100 {
            assert!(text.contains(&format!("Item {i}\n")) || text.contains(&format!("Item {i} ")));
        }
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
    fn a_word_wider_than_the_column_is_broken_and_every_line_fits() {
        let canvas = Canvas::new(fonts());
        let lines = canvas.wrap(TEXT, &"x".repeat(300), 100.0);
        assert!(lines.len() > 1);
        assert_eq!(lines.concat(), "x".repeat(300));
        assert!(lines.iter().all(|l| fonts().width(TEXT, l) <= 100.0));
        assert_eq!(canvas.wrap(TEXT, "", 100.0), vec![String::new()]);
    }

    #[test]
    fn an_unknown_currency_is_a_permanent_error() {
        let order = sample(3, "Ada", "XYZ", vec![item("A", "One", 1, 5)]);
        assert!(matches!(
            render_receipt(&order, &ReceiptSettings::default()),
            Err(EffectError::Permanent { .. })
        ));
    }

    #[test]
    fn characters_dejavu_lacks_are_drawn_by_the_cjk_font_and_the_rest_by_dejavu() {
        let fonts = fonts();
        assert!(
            fonts.cjk_path().is_some(),
            "no CJK font at {DEFAULT_CJK_FONT_PATH}: install fonts-noto-cjk"
        );
        assert_eq!(
            fonts.runs(Face::Regular, "抹茶 (宇治) 30g"),
            vec![
                (Program::Cjk, "抹茶"),
                (Program::Regular, " ("),
                (Program::Cjk, "宇治"),
                (Program::Regular, ") 30g"),
            ]
        );
        assert_eq!(
            fonts.runs(Face::Bold, "Zoë 김민준"),
            vec![(Program::Bold, "Zoë "), (Program::Cjk, "김민준")]
        );
        // In neither font: DejaVu's missing-glyph box, not an invisible gap.
        assert_eq!(
            fonts.runs(Face::Regular, "\u{10FFFD}"),
            vec![(Program::Regular, "\u{10FFFD}")]
        );
        // CJK glyphs are one em wide: measured with the font that draws them.
        let width = fonts.measure(Face::Regular, 10.0, "山田太郎");
        assert!((width - 40.0).abs() < 0.5, "{width}");
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

    #[test]
    fn a_latin_receipt_embeds_no_cjk_font_and_a_cjk_one_only_a_subset() {
        let latin = sample(
            12,
            "Zoë Ångström",
            "EUR",
            vec![item("A", "Green tea", 2, 450)],
        );
        let japanese = sample(13, "山田太郎", "JPY", vec![item("A", "お茶碗", 1, 4500)]);
        let settings = ReceiptSettings::default();
        let latin = render_receipt(&latin, &settings).expect("renders");
        let japanese = render_receipt(&japanese, &settings).expect("renders");
        // Noto Sans CJK is CFF-based, embedded as /FontFile3; DejaVu as /FontFile2.
        let cff = |pdf: &[u8]| pdf.windows(9).filter(|w| w == b"FontFile3").count();
        assert_eq!((cff(&latin), cff(&japanese)), (0, 1));
        assert!(latin.len() < 40_000, "latin: {} bytes", latin.len());
        assert!(
            japanese.len() < 60_000,
            "japanese: {} bytes",
            japanese.len()
        );
        let text = pdf_extract::extract_text_from_mem(&japanese).expect("extractable");
        assert!(
            text.contains("山田太郎") && text.contains("お茶碗"),
            "{text}"
        );
    }

    fn currency(code: &str) -> Currency {
        Currency::parse(code).expect("known currency")
    }
}
