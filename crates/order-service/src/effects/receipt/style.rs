//! Where on the A4 page things go, and how each piece of text is set.

use super::fonts::{Face, Fonts};

impl Fonts {
    pub(super) fn width(&self, style: Style, text: &str) -> f32 {
        self.measure(style.face, style.size, text)
    }
}

// ---------------------------------------------------------------------------
// Geometry (points; PDF's origin is the bottom-left corner)

pub(super) const MM: f32 = 72.0 / 25.4;
pub(super) const PAGE_W_MM: f32 = 210.0;
pub(super) const PAGE_H_MM: f32 = 297.0;
pub(super) const PAGE_W: f32 = PAGE_W_MM * MM;
pub(super) const PAGE_H: f32 = PAGE_H_MM * MM;
pub(super) const LEFT: f32 = 20.0 * MM;
pub(super) const RIGHT: f32 = PAGE_W - 20.0 * MM;
pub(super) const TOP: f32 = PAGE_H - 20.0 * MM;
/// Lowest baseline for table content; the footer lives below it.
pub(super) const BOTTOM: f32 = 25.0 * MM;
pub(super) const FOOTER_Y: f32 = 12.0 * MM;

pub(super) const BODY: f32 = 10.0;
pub(super) const SMALL: f32 = 8.0;
pub(super) const LINE: f32 = 13.0;
pub(super) const SMALL_LINE: f32 = 10.5;
pub(super) const COLUMN_GAP: f32 = 14.0;
/// Narrower than this and names go above their numbers instead of beside them.
pub(super) const MIN_NAME_WIDTH: f32 = 45.0 * MM;
pub(super) const GREY: f32 = 0.4;
/// Outline width of synthetic bold, as a share of the text size.
pub(super) const SYNTHETIC_BOLD_STROKE: f32 = 0.035;

/// How a piece of text is set.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(super) struct Style {
    pub(super) face: Face,
    pub(super) size: f32,
    pub(super) grey: bool,
}

pub(super) const fn style(face: Face, size: f32, grey: bool) -> Style {
    Style { face, size, grey }
}

pub(super) const TEXT: Style = style(Face::Regular, BODY, false);
pub(super) const LABEL: Style = style(Face::Regular, BODY, true);
pub(super) const STRONG: Style = style(Face::Bold, BODY, false);
pub(super) const NOTE: Style = style(Face::Regular, SMALL, true);
pub(super) const TOTAL: Style = style(Face::Bold, 12.0, false);
pub(super) const SHOP: Style = style(Face::Bold, 16.0, false);
pub(super) const TITLE: Style = style(Face::Bold, 16.0, true);
pub(super) const CONTINUED: Style = style(Face::Bold, 11.0, false);
