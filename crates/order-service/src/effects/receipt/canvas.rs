//! How text and rules are placed on pages before they become PDF operations.

use super::fonts::Fonts;
use super::style::Style;

#[derive(Debug, Clone, Copy)]
pub(super) enum Align {
    Left,
    Right,
}

/// One thing drawn on a page, before fonts are registered with the document.
#[derive(Debug, Clone)]
pub(super) enum Draw {
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
pub(super) struct Canvas<'f> {
    pub(super) fonts: &'f Fonts,
    pub(super) pages: Vec<Vec<Draw>>,
}

impl<'f> Canvas<'f> {
    pub(super) fn new(fonts: &'f Fonts) -> Self {
        Canvas {
            fonts,
            pages: vec![Vec::new()],
        }
    }

    pub(super) fn new_page(&mut self) {
        self.pages.push(Vec::new());
    }

    fn push(&mut self, draw: Draw) {
        if let Some(page) = self.pages.last_mut() {
            page.push(draw);
        }
    }

    pub(super) fn text(&mut self, style: Style, x: f32, y: f32, align: Align, text: &str) {
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

    pub(super) fn rule(&mut self, y: f32, thickness: f32) {
        self.push(Draw::Rule { y, thickness });
    }

    /// Splits `text` into lines no wider than `max_width`: at spaces where it
    /// can, inside a word only when the word alone is too wide.
    pub(super) fn wrap(&self, style: Style, text: &str, max_width: f32) -> Vec<String> {
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

#[cfg(test)]
mod tests {
    use super::super::fixtures::*;
    use super::super::style::TEXT;
    use super::*;

    #[test]
    fn a_word_wider_than_the_column_is_broken_and_every_line_fits() {
        let canvas = Canvas::new(fonts());
        let lines = canvas.wrap(TEXT, &"x".repeat(300), 100.0);
        assert!(lines.len() > 1);
        assert_eq!(lines.concat(), "x".repeat(300));
        assert!(lines.iter().all(|l| fonts().width(TEXT, l) <= 100.0));
        assert_eq!(canvas.wrap(TEXT, "", 100.0), vec![String::new()]);
    }
}
