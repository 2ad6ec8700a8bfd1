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
//!
//! The page's geometry and text styles are in `style.rs`, placing text in
//! `canvas.rs`, where an order's parts go in `layout.rs`, the document itself
//! in `pdf.rs`.

mod canvas;
#[cfg(test)]
mod fixtures;
/// The subset of Noto Sans CJK that ships with the repository for the tests
/// (`tests/fonts/`), so that they need no font installed on the machine.
#[cfg(test)]
pub(crate) const TEST_CJK_FONT: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/../../tests/fonts/NotoSansCJK-Regular-subset.otf"
);
mod fonts;
mod layout;
mod pdf;
mod store;
mod style;

pub use store::store_receipt;

use std::path::Path;
use std::sync::Arc;

use self::fonts::Fonts;
pub use self::fonts::{DEFAULT_CJK_FONT_PATH, FontError};
use self::layout::layout;
use self::pdf::emit;
use super::EffectError;
use crate::orders::Order;

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
    let pages = layout(order, settings, order.currency, fonts);
    Ok(emit(order, settings, fonts, pages))
}
