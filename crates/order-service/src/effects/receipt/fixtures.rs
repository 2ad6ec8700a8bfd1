//! Which orders, fonts and checks the receipt's tests share.

use std::path::Path;
use std::sync::LazyLock;

use chrono::DateTime;

use super::canvas::Draw;
use super::fonts::Fonts;
use super::style::Style;
use super::{ReceiptSettings, TEST_CJK_FONT};
use crate::orders::{Currency, Order, OrderId, OrderItem, OrderStatus};

pub(super) fn item(sku: &str, name: &str, quantity: i32, unit_price_cents: i64) -> OrderItem {
    OrderItem {
        id: 0,
        sku: sku.to_owned(),
        name: name.to_owned(),
        quantity,
        unit_price_cents,
    }
}

pub(super) fn sample(id: i64, name: &str, code: &str, items: Vec<OrderItem>) -> Order {
    Order {
        id: OrderId::new(id),
        customer_email: "customer@example.com".to_owned(),
        customer_name: name.to_owned(),
        currency: currency(code),
        total_cents: items.iter().map(OrderItem::line_total_cents).sum(),
        status: OrderStatus::Placed,
        created_at: DateTime::from_timestamp(1_796_036_700, 0).unwrap_or_default(),
        expires_at: None,
        items,
    }
}

/// Receipt settings whose CJK font is the test subset of Noto Sans CJK.
pub(super) fn cjk_settings() -> ReceiptSettings {
    ReceiptSettings::with_cjk_font(Path::new(TEST_CJK_FONT)).expect("the test CJK font parses")
}

/// DejaVu and the test subset of Noto Sans CJK, loaded once.
pub(super) fn fonts() -> &'static Fonts {
    static FONTS: LazyLock<Fonts> = LazyLock::new(|| {
        Fonts::with_cjk_font(Path::new(TEST_CJK_FONT)).expect("the test CJK font parses")
    });
    &FONTS
}

pub(super) fn texts(pages: &[Vec<Draw>]) -> impl Iterator<Item = (usize, Style, f32, f32, &str)> {
    pages.iter().enumerate().flat_map(|(page, draws)| {
        draws.iter().filter_map(move |draw| match draw {
            Draw::Text { style, x, y, text } => Some((page, *style, *x, *y, text.as_str())),
            Draw::Rule { .. } => None,
        })
    })
}
/// No two pieces of text share ink: boxes from baseline-descent to baseline+ascent.
pub(super) fn assert_no_overlaps(pages: &[Vec<Draw>]) {
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

pub(super) fn currency(code: &str) -> Currency {
    Currency::parse(code).expect("known currency")
}
