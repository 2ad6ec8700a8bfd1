//! order_webhook: placeholder until the effects issue lands (same session).

use std::time::Duration;

use super::EffectError;
use crate::orders::Order;

#[derive(Clone)]
pub struct WebhookConfig {
    pub url: url::Url,
    pub secret: String,
    pub timeout: Duration,
}

impl std::fmt::Debug for WebhookConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("WebhookConfig")
            .field("url", &self.url.as_str())
            .field("secret", &"***")
            .field("timeout", &self.timeout)
            .finish()
    }
}

#[derive(Debug)]
pub struct WebhookSender {
    _config: WebhookConfig,
}

impl WebhookSender {
    pub fn new(config: &WebhookConfig) -> anyhow::Result<WebhookSender> {
        Ok(WebhookSender {
            _config: config.clone(),
        })
    }

    pub async fn deliver(&self, _job_id: i64, _order: &Order) -> Result<(), EffectError> {
        Err(EffectError::permanent(
            "order_webhook is not implemented yet",
        ))
    }
}
