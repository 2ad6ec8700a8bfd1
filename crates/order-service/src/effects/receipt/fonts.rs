//! The receipt's fonts, and which of them draws each character.
//!
//! DejaVu Sans (embedded, regular and bold) covers Latin, Greek and Cyrillic
//! but no Chinese, Japanese or Korean. Those come from a CJK font read at start:
//! `RECEIPT_FONT_PATH`, or Debian's `fonts-noto-cjk` at
//! [`DEFAULT_CJK_FONT_PATH`]. Text is split into runs by character: what
//! DejaVu has, DejaVu draws (so Latin receipts look as they always did), the
//! rest the CJK font. Each font is subset to the glyphs a receipt uses, so a
//! 20 MB collection adds a few kilobytes per receipt, not megabytes.
//!
//! There is one CJK face for regular and bold text: a second 20 MB face for
//! the shop name alone is not worth its memory in every relay, so bold CJK is
//! emboldened when drawn (see `emit` in `pdf.rs`).

use std::collections::BTreeSet;
use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, LazyLock};

use printpdf::ParsedFont;

const REGULAR_TTF: &[u8] = include_bytes!("../../../../../templates/fonts/DejaVuSans.ttf");
const BOLD_TTF: &[u8] = include_bytes!("../../../../../templates/fonts/DejaVuSans-Bold.ttf");

/// Where Debian's (and the Docker image's) `fonts-noto-cjk` puts Noto Sans CJK.
pub const DEFAULT_CJK_FONT_PATH: &str = "/usr/share/fonts/opentype/noto/NotoSansCJK-Regular.ttc";
/// The face used from a font collection (`.ttc`). In Noto Sans CJK that is
/// the Japanese one; every face of that collection has every Han, kana and
/// hangul character, only some Han glyph shapes follow Japanese conventions.
pub const COLLECTION_FACE: usize = 0;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Face {
    Regular,
    Bold,
}

/// One embedded font program of a receipt.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub(super) enum Program {
    Regular,
    Bold,
    Cjk,
}

/// Why a CJK font cannot be used. Names the file; the caller names the variable.
#[derive(Debug, thiserror::Error)]
pub enum FontError {
    #[error("cannot read {path}: {source}")]
    Read {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error(
        "{path} is not a font this renderer can read (TrueType or OpenType, or a collection of them)"
    )]
    Parse { path: PathBuf },
    #[error("the embedded DejaVu Sans does not parse")]
    Embedded,
}

/// The fonts receipts are set in. Cheap to share: render threads hold an `Arc`.
pub struct Fonts {
    regular: ParsedFont,
    bold: ParsedFont,
    cjk: Option<Cjk>,
}

struct Cjk {
    font: ParsedFont,
    path: PathBuf,
}

impl fmt::Debug for Fonts {
    // ParsedFont's own Debug prints the whole font file.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Fonts")
            .field("cjk", &self.cjk.as_ref().map(|c| c.path.display()))
            .finish_non_exhaustive()
    }
}

static DEFAULT_FONTS: LazyLock<Result<Arc<Fonts>, String>> = LazyLock::new(|| {
    Fonts::with_default_cjk()
        .map(Arc::new)
        .map_err(|e| e.to_string())
});

/// The process-wide fonts of receipts whose settings name no font: DejaVu
/// and, when installed, the default CJK font. Loaded on first use.
pub fn default_fonts() -> Result<&'static Arc<Fonts>, String> {
    DEFAULT_FONTS.as_ref().map_err(Clone::clone)
}

impl Fonts {
    /// DejaVu and the CJK font at `path`. Any problem with `path` is an error:
    /// it was asked for.
    pub fn with_cjk_font(path: &Path) -> Result<Fonts, FontError> {
        let bytes = std::fs::read(path).map_err(|source| FontError::Read {
            path: path.to_owned(),
            source,
        })?;
        let font = ParsedFont::from_bytes(&bytes, COLLECTION_FACE, &mut Vec::new())
            .filter(|f| !f.codepoint_to_glyph.is_empty())
            .ok_or_else(|| FontError::Parse {
                path: path.to_owned(),
            })?;
        Ok(Fonts {
            cjk: Some(Cjk {
                font,
                path: path.to_owned(),
            }),
            ..Fonts::dejavu_only()?
        })
    }

    /// DejaVu and, if it is there, the font at [`DEFAULT_CJK_FONT_PATH`]; when
    /// it is missing or unusable, DejaVu only, with a warning (once per
    /// process, since the default fonts are loaded once).
    pub fn with_default_cjk() -> Result<Fonts, FontError> {
        let path = Path::new(DEFAULT_CJK_FONT_PATH);
        match Fonts::with_cjk_font(path) {
            Ok(fonts) => Ok(fonts),
            Err(FontError::Embedded) => Err(FontError::Embedded),
            Err(error) => {
                tracing::warn!(
                    error = %error,
                    "no CJK font: Chinese, Japanese and Korean text will print as empty \
                     boxes on receipts (install fonts-noto-cjk or set RECEIPT_FONT_PATH)"
                );
                Fonts::dejavu_only()
            }
        }
    }

    pub fn dejavu_only() -> Result<Fonts, FontError> {
        let parse = |bytes: &[u8]| {
            ParsedFont::from_bytes(bytes, 0, &mut Vec::new()).ok_or(FontError::Embedded)
        };
        Ok(Fonts {
            regular: parse(REGULAR_TTF)?,
            bold: parse(BOLD_TTF)?,
            cjk: None,
        })
    }

    /// The CJK font's file, if there is one.
    pub fn cjk_path(&self) -> Option<&Path> {
        self.cjk.as_ref().map(|c| c.path.as_path())
    }

    pub(super) fn get(&self, program: Program) -> &ParsedFont {
        match (program, &self.cjk) {
            (Program::Cjk, Some(cjk)) => &cjk.font,
            (Program::Bold, _) => &self.bold,
            (Program::Regular | Program::Cjk, _) => &self.regular,
        }
    }

    /// Which program draws `c` in `face`: DejaVu when it has the glyph, else
    /// the CJK font when that has it, else DejaVu's "missing" box.
    pub(super) fn program(&self, face: Face, c: char) -> Program {
        let dejavu = match face {
            Face::Regular => Program::Regular,
            Face::Bold => Program::Bold,
        };
        let has = |font: &ParsedFont| {
            font.lookup_glyph_index(u32::from(c))
                .is_some_and(|g| g != 0)
        };
        match &self.cjk {
            Some(cjk) if !has(self.get(dejavu)) && has(&cjk.font) => Program::Cjk,
            _ => dejavu,
        }
    }

    /// `text` cut into the longest pieces one program draws, in order.
    pub(super) fn runs<'t>(&self, face: Face, text: &'t str) -> Vec<(Program, &'t str)> {
        let mut runs: Vec<(Program, &'t str)> = Vec::new();
        let mut start = 0;
        let mut current = None;
        for (at, c) in text.char_indices() {
            let program = self.program(face, c);
            match current {
                Some(p) if p == program => {}
                Some(p) => {
                    runs.push((p, &text[start..at]));
                    start = at;
                    current = Some(program);
                }
                None => current = Some(program),
            }
        }
        if let Some(p) = current {
            runs.push((p, &text[start..]));
        }
        runs
    }

    /// Width of `text` in points at `size`. printpdf shows text glyph by glyph
    /// without kerning, so the sum of advances is exactly what gets drawn.
    pub(super) fn measure(&self, face: Face, size: f32, text: &str) -> f32 {
        self.runs(face, text)
            .into_iter()
            .map(|(program, run)| {
                let font = self.get(program);
                let units: u32 = run
                    .chars()
                    .map(|c| {
                        let gid = font.lookup_glyph_index(u32::from(c)).unwrap_or(0);
                        u32::from(font.get_glyph_width(gid).unwrap_or(0))
                    })
                    .sum();
                units as f32 * size / f32::from(font.units_per_em.max(1))
            })
            .sum()
    }

    /// `program` cut down to the glyphs of `chars`. printpdf subsets only with
    /// its `text_layout` feature, which this crate leaves off; without this a
    /// receipt embeds whole fonts (~750 KB of DejaVu, ~16 MB of CJK) instead
    /// of the glyphs it shows. If subsetting fails the receipt still renders,
    /// only larger.
    pub(super) fn subset_or_whole(&self, program: Program, chars: &BTreeSet<char>) -> ParsedFont {
        let font = self.get(program);
        subset(font, chars).unwrap_or_else(|e| {
            tracing::warn!(error = %e, ?program, "font subsetting failed; embedding the whole font");
            font.clone()
        })
    }
}

fn subset(font: &ParsedFont, chars: &BTreeSet<char>) -> Result<ParsedFont, String> {
    use allsorts::binary::read::ReadScope;
    use allsorts::font_data::FontData;
    use allsorts::subset::{CmapTarget, SubsetProfile};

    let glyphs: BTreeSet<u16> = chars
        .iter()
        .filter_map(|c| font.lookup_glyph_index(u32::from(*c)))
        .filter(|gid| *gid != 0)
        .collect();
    // allsorts wants .notdef first; subset glyph ids follow this order.
    let ids: Vec<u16> = std::iter::once(0).chain(glyphs).collect();
    let data = ReadScope::new(&font.original_bytes)
        .read::<FontData<'_>>()
        .map_err(|e| e.to_string())?;
    // A collection's face is picked here; the subset is a single font.
    let index = usize::try_from(font.font_index).map_err(|e| e.to_string())?;
    let provider = data.table_provider(index).map_err(|e| e.to_string())?;
    let program =
        allsorts::subset::subset(&provider, &ids, &SubsetProfile::Pdf, CmapTarget::Unicode)
            .map_err(|e| e.to_string())?;
    ParsedFont::from_bytes(&program, 0, &mut Vec::new())
        .ok_or_else(|| "the subset font does not parse".to_owned())
}

#[cfg(test)]
mod tests {
    use super::super::fixtures::fonts;
    use super::*;

    #[test]
    fn characters_dejavu_lacks_are_drawn_by_the_cjk_font_and_the_rest_by_dejavu() {
        let fonts = fonts();
        assert!(fonts.cjk_path().is_some(), "the test CJK font is loaded");
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
}
