//! What the effects make of their configuration ([`EffectArgs`],
//! [`ReceiptArgs`]), checked at start against the kinds a relay handles: a
//! setting an effect needs and lacks stops the relay, naming the variable.

use crate::config::{ConfigError, EffectArgs, ReceiptArgs, parse_proxy, redacted_proxy};
use crate::effects::email::EmailConfig;
use crate::effects::nats::{NatsConnections, NatsCredentials};
use crate::effects::receipt::ReceiptSettings;
use crate::effects::webhook::DeliveryOptions;

/// The mail settings, required when the relay handles an email kind
/// (confirmation_email, order_email).
/// The receipt links are the caller's to add, from `LinkArgs`.
pub fn email(args: &EffectArgs, needed: bool) -> Result<Option<EmailConfig>, ConfigError> {
    if !needed {
        return Ok(None);
    }
    let smtp_url = args.smtp_url.clone().ok_or_else(|| {
        ConfigError(
            "SMTP_URL is not set, but this relay sends email (confirmation_email, order_email) \
             (set SMTP_URL and MAIL_FROM, or leave both out of --kinds)"
                .into(),
        )
    })?;
    let mail_from = args.mail_from.clone().ok_or_else(|| {
        ConfigError(
            "MAIL_FROM is not set, but this relay sends email (confirmation_email, order_email)"
                .into(),
        )
    })?;
    Ok(Some(EmailConfig {
        smtp_url,
        mail_from,
        public_base_url: args.public_base_url.to_string(),
        receipt_links: None,
    }))
}

/// What a relay needs to deliver to endpoints (order_webhook,
/// endpoint_notice): no URL of its own, since every endpoint row has one.
/// `WEBHOOK_URL` is not needed: it only makes the endpoint `default`.
pub fn webhook(args: &EffectArgs, needed: bool) -> Result<Option<DeliveryOptions>, ConfigError> {
    if !needed {
        return Ok(None);
    }
    let proxy = args
        .webhook_proxy
        .as_deref()
        .map(|raw| {
            parse_proxy(raw)
                .map_err(|e| ConfigError(format!("WEBHOOK_PROXY {}: {e}", redacted_proxy(raw))))
        })
        .transpose()?;
    Ok(Some(DeliveryOptions {
        timeout: args.webhook_timeout,
        allow_private: args.webhook_allow_private,
        proxy,
    }))
}

/// The NATS connections of a relay that publishes (with `NATS_CREDENTIALS`,
/// read now so that a bad file fails the start, naming the variable).
pub async fn nats(args: &EffectArgs) -> Result<NatsConnections, ConfigError> {
    let credentials = match &args.nats_credentials {
        Some(path) => Some(NatsCredentials::load(path).await.map_err(ConfigError)?),
        None => None,
    };
    Ok(NatsConnections::new(
        credentials,
        args.webhook_allow_private,
    ))
}

/// The receipt settings, fonts loaded now so that problems show at start:
/// a `RECEIPT_FONT_PATH` that cannot be read is an error; a missing default
/// font only a warning (CJK then prints as boxes).
pub fn receipt(args: &ReceiptArgs, needed: bool) -> Result<ReceiptSettings, ConfigError> {
    let settings = match (&args.receipt_font_path, needed) {
        (_, false) => return Ok(ReceiptSettings::default()),
        (Some(path), true) => ReceiptSettings::with_cjk_font(path)
            .map_err(|e| ConfigError(format!("RECEIPT_FONT_PATH: {e}")))?,
        (None, true) => ReceiptSettings::default(),
    };
    settings
        .preload()
        .map_err(|e| ConfigError(format!("receipt fonts: {e}")))?;
    Ok(settings)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::relay_args;

    #[test]
    fn a_relay_that_sends_email_needs_smtp_url_and_mail_from() {
        let none = relay_args(&[]).expect("parses");
        let error = email(&none.effects, true).expect_err("refused");
        assert!(error.0.starts_with("SMTP_URL is not set"), "{error}");
        assert!(email(&none.effects, false).expect("not needed").is_none());
        let set = relay_args(&[
            "--smtp-url",
            "smtp://127.0.0.1:2525",
            "--mail-from",
            "Shop <orders@shop.example>",
        ])
        .expect("parses");
        let config = email(&set.effects, true).expect("valid").expect("needed");
        assert_eq!(config.mail_from, "Shop <orders@shop.example>");
    }

    #[test]
    fn a_bad_webhook_proxy_is_refused_without_its_login_only_where_webhooks_go() {
        let args = relay_args(&["--webhook-proxy", "http://relay:hunter2@proxy:3128/path"])
            .expect("parses");
        let error = webhook(&args.effects, true).expect_err("refused");
        assert!(
            error
                .0
                .starts_with("WEBHOOK_PROXY http://***@proxy:3128: a proxy URL has no path"),
            "{error}"
        );
        assert!(!error.0.contains("hunter2"), "{error}");
        assert!(webhook(&args.effects, false).expect("not needed").is_none());
    }

    #[test]
    fn an_unreadable_receipt_font_path_is_an_error_naming_the_variable() {
        let args = relay_args(&["--receipt-font-path", "/nonexistent/font.ttc"]).expect("parses");
        let error = receipt(&args.receipt, true).expect_err("refused");
        assert!(
            error
                .0
                .starts_with("RECEIPT_FONT_PATH: cannot read /nonexistent/font.ttc"),
            "{error}"
        );
        assert!(
            receipt(&args.receipt, false).is_ok(),
            "not read when not needed"
        );
        let not_a_font = relay_args(&["--receipt-font-path", "Cargo.toml"]).expect("parses");
        let error = receipt(&not_a_font.receipt, true).expect_err("refused");
        assert!(error.0.contains("Cargo.toml is not a font"), "{error}");
    }

    #[test]
    fn an_explicit_receipt_font_path_is_the_font_receipts_use() {
        let path = crate::effects::receipt::TEST_CJK_FONT;
        let args = relay_args(&["--receipt-font-path", path]).expect("parses");
        let settings = receipt(&args.receipt, true).expect("the test font loads");
        assert_eq!(
            settings.preload().expect("loaded"),
            Some(std::path::Path::new(path))
        );
    }
}
