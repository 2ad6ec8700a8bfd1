//! confirmation_email: placeholder until the effects issue lands (same session).

use super::EffectError;
use crate::orders::Order;

#[derive(Debug, Clone)]
pub struct EmailConfig {
    pub smtp_url: String,
    pub mail_from: String,
    pub public_base_url: String,
}

#[derive(Debug)]
pub struct Mailer {
    _config: EmailConfig,
}

impl Mailer {
    pub fn new(config: &EmailConfig) -> anyhow::Result<Mailer> {
        Ok(Mailer {
            _config: config.clone(),
        })
    }

    pub async fn send_confirmation(&self, _job_id: i64, _order: &Order) -> Result<(), EffectError> {
        Err(EffectError::permanent(
            "confirmation_email is not implemented yet",
        ))
    }
}
