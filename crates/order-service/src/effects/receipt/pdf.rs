//! How laid-out pages become a PDF: footers added, fonts subset to the
//! characters drawn, text and rules turned into printpdf operations.

use std::collections::{BTreeMap, BTreeSet};

use printpdf::{
    Color, FontId, Greyscale, Line, LinePoint, Mm, Op, PdfDocument, PdfFontHandle, PdfPage,
    PdfSaveOptions, Point, Pt, TextItem, TextRenderingMode,
};

use super::ReceiptSettings;
use super::canvas::{Align, Canvas, Draw};
use super::fonts::{Face, Fonts, Program};
use super::style::*;
use crate::orders::Order;

pub(super) fn emit(
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

pub(super) fn footer(
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

pub(super) fn grey_color(level: f32) -> Color {
    Color::Greyscale(Greyscale {
        percent: level,
        icc_profile: None,
    })
}

#[cfg(test)]
mod tests {
    use super::super::fixtures::*;
    use super::super::layout::layout;
    use super::super::{ReceiptSettings, render_receipt};

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
    fn a_latin_receipt_embeds_no_cjk_font_and_a_cjk_one_only_a_subset() {
        let latin = sample(
            12,
            "Zoë Ångström",
            "EUR",
            vec![item("A", "Green tea", 2, 450)],
        );
        let japanese = sample(13, "山田太郎", "JPY", vec![item("A", "お茶碗", 1, 4500)]);
        let settings = cjk_settings();
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
}
