//! receipt_pdf: placeholder until the effects issue lands (same session).

use super::EffectError;
use crate::orders::Order;

#[derive(Debug, Clone)]
pub struct ReceiptSettings {
    pub shop_name: String,
}

impl Default for ReceiptSettings {
    fn default() -> Self {
        ReceiptSettings {
            shop_name: "Outbox Relay Demo Shop".to_owned(),
        }
    }
}

pub fn render_receipt(_order: &Order, _settings: &ReceiptSettings) -> Result<Vec<u8>, EffectError> {
    Err(EffectError::permanent("receipt_pdf is not implemented yet"))
}
