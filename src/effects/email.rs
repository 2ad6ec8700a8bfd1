//! confirmation_email: a multipart text + HTML message over SMTP (lettre).
//!
//! The `Message-ID` is derived from the job id, so every attempt of a job sends
//! the same message as far as mail systems can tell: a send whose 250 was lost
//! and that is retried shows up downstream as a duplicate of one message, not as
//! two messages.
//!
//! | SMTP outcome                                             | class      |
//! | -------------------------------------------------------- | ---------- |
//! | 2xx                                                      | done       |
//! | 4xx (greylisting, full queue, rate limit)                | retryable  |
//! | connection refused/reset, timeout, TLS failure           | retryable  |
//! | 530/534/535/538: our credentials or TLS set-up refused   | retryable  |
//! | any other 5xx (550 unknown recipient, 552, 554, ...)      | permanent  |
//! | recipient address that does not parse                    | permanent  |
//!
//! Authentication failures are a relay configuration problem, not a property
//! of the message: retrying them gives an operator time to fix `SMTP_URL`
//! without failing every confirmation in the meantime.

use std::fmt;
use std::time::Duration;

use anyhow::{Context as _, anyhow};
use lettre::message::header::{HeaderName, HeaderValue};
use lettre::message::{Mailbox, MultiPart};
use lettre::transport::smtp::Error as SmtpError;
use lettre::{Address, AsyncSmtpTransport, AsyncTransport, Message, Tokio1Executor};
use minijinja::{Environment, UndefinedBehavior};
use serde::Serialize;

use super::{EffectError, error_chain};
use crate::orders::{Currency, Order};

/// Per SMTP command (connect, EHLO, MAIL, RCPT, DATA, ...). lettre's default is 60s.
pub const SMTP_COMMAND_TIMEOUT: Duration = Duration::from_secs(30);
/// For one whole send, including waiting for a pooled connection.
pub const SMTP_SEND_DEADLINE: Duration = Duration::from_secs(120);

/// Embedded, so the binary needs no `templates/` directory at run time. The
/// `.html` extension turns on minijinja's HTML auto-escaping for that template.
const TEMPLATES: [(&str, &str); 6] = [
    (
        "confirmation.txt",
        include_str!("../../templates/email/confirmation.txt"),
    ),
    (
        "confirmation.html",
        include_str!("../../templates/email/confirmation.html"),
    ),
    (
        "shipped.txt",
        include_str!("../../templates/email/shipped.txt"),
    ),
    (
        "shipped.html",
        include_str!("../../templates/email/shipped.html"),
    ),
    (
        "cancelled.txt",
        include_str!("../../templates/email/cancelled.txt"),
    ),
    (
        "cancelled.html",
        include_str!("../../templates/email/cancelled.html"),
    ),
];

/// Which email an event sends: the template's name and the subject.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EmailKind {
    Confirmation,
    Shipped,
    Cancelled,
}

impl EmailKind {
    /// The email for an event type; `None` for events that mail nobody.
    pub fn for_event(event_type: &str) -> Option<EmailKind> {
        match event_type {
            "order.placed" => Some(EmailKind::Confirmation),
            "order.shipped" => Some(EmailKind::Shipped),
            "order.cancelled" => Some(EmailKind::Cancelled),
            _ => None,
        }
    }

    fn template(self) -> &'static str {
        match self {
            EmailKind::Confirmation => "confirmation",
            EmailKind::Shipped => "shipped",
            EmailKind::Cancelled => "cancelled",
        }
    }

    fn subject(self, order_id: i64) -> String {
        match self {
            EmailKind::Confirmation => format!("Your order #{order_id} is confirmed"),
            EmailKind::Shipped => format!("Your order #{order_id} is on its way"),
            EmailKind::Cancelled => format!("Your order #{order_id} has been cancelled"),
        }
    }
}

#[derive(Clone)]
pub struct EmailConfig {
    /// lettre's URL form; may carry credentials, so it is never printed whole.
    pub smtp_url: String,
    pub mail_from: String,
    pub public_base_url: String,
}

impl fmt::Debug for EmailConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("EmailConfig")
            .field("smtp_url", &redact_url(&self.smtp_url))
            .field("mail_from", &self.mail_from)
            .field("public_base_url", &self.public_base_url)
            .finish()
    }
}

/// Sends confirmation emails through one pooled SMTP transport.
pub struct Mailer {
    transport: AsyncSmtpTransport<Tokio1Executor>,
    from: Mailbox,
    /// Right-hand side of every `Message-ID`: the sender's domain.
    message_id_domain: String,
    public_base_url: url::Url,
    templates: Environment<'static>,
    /// The SMTP password, scrubbed from every error we report.
    password: Option<String>,
}

impl fmt::Debug for Mailer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Mailer")
            .field("from", &self.from.to_string())
            .field("public_base_url", &self.public_base_url.as_str())
            .finish_non_exhaustive()
    }
}

impl Mailer {
    /// Checks the whole configuration; errors name the variable at fault and
    /// never include the SMTP password.
    pub fn new(config: &EmailConfig) -> anyhow::Result<Mailer> {
        let from: Mailbox = config.mail_from.parse().map_err(|e| {
            anyhow!(
                "MAIL_FROM {:?} is not a mailbox such as \"Shop <orders@example.com>\": {e}",
                config.mail_from
            )
        })?;
        let transport = AsyncSmtpTransport::<Tokio1Executor>::from_url(&config.smtp_url)
            .map_err(|e| {
                anyhow!(
                    "SMTP_URL {} is not usable (expected smtp://host:port, \
                     smtps://user:pass@host or smtp://user:pass@host?tls=required): {e}",
                    redact_url(&config.smtp_url)
                )
            })?
            .timeout(Some(SMTP_COMMAND_TIMEOUT))
            .build();
        let public_base_url = url::Url::parse(&config.public_base_url)
            .ok()
            .filter(|u| !u.cannot_be_a_base())
            .ok_or_else(|| {
                anyhow!(
                    "PUBLIC_BASE_URL {:?} is not a base URL such as https://shop.example.com",
                    config.public_base_url
                )
            })?;
        let password = url::Url::parse(&config.smtp_url)
            .ok()
            .and_then(|u| u.password().map(percent_decoded))
            .filter(|p| !p.is_empty());
        Ok(Mailer {
            transport,
            message_id_domain: from.email.domain().to_owned(),
            from,
            public_base_url,
            templates: templates().context("the embedded email templates do not load")?,
            password,
        })
    }

    /// Sends the confirmation of `order` as job `job_id`.
    pub async fn send_confirmation(&self, job_id: i64, order: &Order) -> Result<(), EffectError> {
        self.send(
            job_id,
            order,
            EmailKind::Confirmation,
            &serde_json::Value::Null,
        )
        .await
    }

    /// Sends the `kind` email of `order` as job `job_id`; `details` is the
    /// event's data (carrier and tracking number, reason).
    pub async fn send(
        &self,
        job_id: i64,
        order: &Order,
        kind: EmailKind,
        details: &serde_json::Value,
    ) -> Result<(), EffectError> {
        let message = self.compose(job_id, order, kind, details)?;
        match tokio::time::timeout(SMTP_SEND_DEADLINE, self.transport.send(message)).await {
            Ok(Ok(_)) => Ok(()),
            Ok(Err(e)) => Err(self.classify(&e)),
            Err(_) => Err(EffectError::retryable(format!(
                "SMTP send did not finish within {}",
                humantime::format_duration(SMTP_SEND_DEADLINE)
            ))),
        }
    }

    /// `<job-{id}.confirmation@{sender's domain}>`: the same for every attempt.
    pub fn message_id(&self, job_id: i64) -> String {
        message_id_for(job_id, &self.message_id_domain)
    }

    fn compose(
        &self,
        job_id: i64,
        order: &Order,
        kind: EmailKind,
        details: &serde_json::Value,
    ) -> Result<Message, EffectError> {
        let address: Address = order.customer_email.parse().map_err(|e| {
            EffectError::permanent(format!(
                "recipient {:?} of order {} is not an email address: {e}",
                order.customer_email, order.id
            ))
        })?;
        let to = Mailbox::new(display_name(&order.customer_name), address);
        let mut view = ConfirmationView::new(order, &self.receipt_url(order.id), &self.from)?;
        let detail = |name: &str| {
            details
                .get(name)
                .and_then(serde_json::Value::as_str)
                .map(str::to_owned)
        };
        view.carrier = detail("carrier");
        view.tracking_number = detail("tracking_number");
        view.reason = detail("reason");
        let render = |name: &str| {
            self.templates
                .get_template(name)
                .and_then(|t| t.render(minijinja::value::Serde(&view)))
                .map_err(|e| {
                    EffectError::permanent(format!("email template {name} does not render: {e}"))
                })
        };
        let text = render(&format!("{}.txt", kind.template()))?;
        let html = render(&format!("{}.html", kind.template()))?;
        let mut message = Message::builder()
            .from(self.from.clone())
            .to(to)
            .subject(kind.subject(order.id))
            .message_id(Some(self.message_id(job_id)));
        // The job's trace, for whoever follows the mail back to its order.
        if let Some(traceparent) = crate::trace_context::current_traceparent() {
            message = message.raw_header(HeaderValue::new(
                HeaderName::new_from_ascii_str("traceparent"),
                traceparent,
            ));
        }
        message
            .multipart(MultiPart::alternative_plain_html(text, html))
            .map_err(|e| {
                EffectError::permanent(format!(
                    "confirmation for order {} cannot be built: {e}",
                    order.id
                ))
            })
    }

    /// `PUBLIC_BASE_URL/orders/{id}/receipt.pdf`, keeping any path prefix of the base.
    fn receipt_url(&self, order_id: i64) -> String {
        let mut url = self.public_base_url.clone();
        if let Ok(mut path) = url.path_segments_mut() {
            path.pop_if_empty()
                .extend(["orders", &order_id.to_string(), "receipt.pdf"]);
        }
        url.to_string()
    }

    fn classify(&self, error: &SmtpError) -> EffectError {
        let detail = self.scrub(&error_chain(error));
        match error.status().map(u16::from) {
            Some(530 | 534 | 535 | 538) => EffectError::retryable(format!(
                "SMTP server refused our credentials or TLS set-up (check SMTP_URL): {detail}"
            )),
            _ if error.is_permanent() => {
                EffectError::permanent(format!("SMTP server rejected the message: {detail}"))
            }
            _ if error.is_transient() => {
                EffectError::retryable(format!("SMTP server deferred the message: {detail}"))
            }
            _ if error.is_timeout() => EffectError::retryable(format!("SMTP timed out: {detail}")),
            _ => EffectError::retryable(format!("SMTP transport failed: {detail}")),
        }
    }

    /// `text` with the SMTP password replaced: a server may echo what it got.
    fn scrub(&self, text: &str) -> String {
        match &self.password {
            Some(password) => text.replace(password.as_str(), "***"),
            None => text.to_owned(),
        }
    }
}

fn templates() -> Result<Environment<'static>, minijinja::Error> {
    let mut env = Environment::new();
    // A misspelt variable is an error in tests, not a blank in a customer's mail.
    env.set_undefined_behavior(UndefinedBehavior::Strict);
    env.set_syntax(
        minijinja::syntax::SyntaxConfig::builder()
            .trim_blocks(true)
            .lstrip_blocks(true)
            .build()?,
    );
    for (name, source) in TEMPLATES {
        env.add_template(name, source)?;
    }
    Ok(env)
}

/// What the templates see: every amount already formatted for its currency.
#[derive(Debug, Serialize)]
struct ConfirmationView {
    customer_name: String,
    order_id: i64,
    items: Vec<ItemView>,
    total: String,
    receipt_url: String,
    /// The sender's display name, signed under the message.
    shop: Option<String>,
    /// For the shipped email.
    carrier: Option<String>,
    tracking_number: Option<String>,
    /// For the cancelled email.
    reason: Option<String>,
}

#[derive(Debug, Serialize)]
struct ItemView {
    sku: String,
    name: String,
    quantity: i32,
    unit_price: String,
    line_total: String,
}

impl ConfirmationView {
    fn new(order: &Order, receipt_url: &str, from: &Mailbox) -> Result<Self, EffectError> {
        let currency = Currency::parse(&order.currency).ok_or_else(|| {
            EffectError::permanent(format!(
                "order {} has an unknown currency {:?}",
                order.id, order.currency
            ))
        })?;
        Ok(ConfirmationView {
            customer_name: order.customer_name.clone(),
            order_id: order.id,
            items: order
                .items
                .iter()
                .map(|item| ItemView {
                    sku: item.sku.clone(),
                    name: item.name.clone(),
                    quantity: item.quantity,
                    unit_price: currency.format(item.unit_price_cents),
                    line_total: currency.format(item.line_total_cents()),
                })
                .collect(),
            total: currency.format(order.total_cents),
            receipt_url: receipt_url.to_owned(),
            shop: from.name.clone().filter(|n| !n.trim().is_empty()),
            carrier: None,
            tracking_number: None,
            reason: None,
        })
    }
}

/// A customer's name fit for a `To` header. lettre encodes names (RFC 2047),
/// but panics on CR or LF in one; `NewOrder` refuses control characters at the
/// edge, and this keeps a row written some other way from crashing a worker
/// or smuggling in a header.
fn display_name(raw: &str) -> Option<String> {
    let name = raw
        .split(|c: char| c.is_whitespace() || c.is_control())
        .filter(|w| !w.is_empty())
        .collect::<Vec<_>>()
        .join(" ");
    (!name.is_empty()).then_some(name)
}

/// The `Message-ID` of job `job_id`'s confirmation email when the sender's
/// domain is `domain`: the one definition the mailer and the dashboard share.
pub fn message_id_for(job_id: i64, domain: &str) -> String {
    format!("<job-{job_id}.confirmation@{domain}>")
}

/// The domain of a `MAIL_FROM` mailbox (`Shop <orders@shop.example>`), if it is one.
pub fn mail_from_domain(mail_from: &str) -> Option<String> {
    mail_from
        .parse::<Mailbox>()
        .ok()
        .map(|m| m.email.domain().to_owned())
}

/// `raw` with its password replaced, or a placeholder if it does not parse
/// (an unparsable URL may still hold a password).
pub fn redact_url(raw: &str) -> String {
    match url::Url::parse(raw) {
        Ok(mut url) => {
            if url.password().is_some() {
                let _ = url.set_password(Some("***"));
            }
            url.to_string()
        }
        Err(_) => "(unparsable, not shown)".to_owned(),
    }
}

fn percent_decoded(raw: &str) -> String {
    percent_encoding::percent_decode_str(raw)
        .decode_utf8_lossy()
        .into_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config() -> EmailConfig {
        EmailConfig {
            smtp_url: "smtp://mailer:p%40ss-w0rd@127.0.0.1:2525".to_owned(),
            mail_from: "Outbox Shop <orders@shop.example>".to_owned(),
            public_base_url: "https://shop.example/store/".to_owned(),
        }
    }

    #[tokio::test]
    async fn a_bad_mail_from_is_named_in_the_error() {
        let error = Mailer::new(&EmailConfig {
            mail_from: "not a mailbox".to_owned(),
            ..config()
        })
        .expect_err("refused");
        assert!(
            error.to_string().contains("MAIL_FROM \"not a mailbox\""),
            "{error}"
        );
    }

    #[tokio::test]
    async fn a_bad_smtp_url_is_named_without_its_password() {
        for smtp_url in [
            "ftp://u:hunter2@host",
            "smtp://u:hunter2@",
            "smtp:// u:hunter2@x y",
        ] {
            let error = Mailer::new(&EmailConfig {
                smtp_url: smtp_url.to_owned(),
                ..config()
            })
            .expect_err("refused");
            let shown = format!("{error:#}");
            assert!(shown.contains("SMTP_URL"), "{shown}");
            assert!(!shown.contains("hunter2"), "{shown}");
        }
    }

    #[tokio::test]
    async fn tls_smtp_urls_build_a_transport_with_lettres_own_crypto_provider() {
        for smtp_url in [
            "smtps://u:p@smtp.example.com",
            "smtp://u:p@smtp.example.com:587?tls=required",
            "smtp://smtp.example.com?tls=opportunistic",
        ] {
            Mailer::new(&EmailConfig {
                smtp_url: smtp_url.to_owned(),
                ..config()
            })
            .unwrap_or_else(|e| panic!("{smtp_url}: {e:#}"));
        }
    }

    #[tokio::test]
    async fn debug_output_hides_the_smtp_password() {
        let config = config();
        let mailer = Mailer::new(&config).expect("valid config");
        for shown in [format!("{config:?}"), format!("{mailer:?}")] {
            assert!(
                !shown.contains("p%40ss-w0rd") && !shown.contains("p@ss-w0rd"),
                "{shown}"
            );
        }
        assert_eq!(mailer.password.as_deref(), Some("p@ss-w0rd"));
    }

    #[tokio::test]
    async fn message_ids_come_from_the_job_and_the_senders_domain() {
        let mailer = Mailer::new(&config()).expect("valid config");
        assert_eq!(mailer.message_id(42), "<job-42.confirmation@shop.example>");
        assert_eq!(
            mailer.receipt_url(7),
            "https://shop.example/store/orders/7/receipt.pdf"
        );
    }

    #[test]
    fn display_names_lose_line_breaks_and_control_characters() {
        assert_eq!(
            display_name("Eve\r\nBcc: x@y.z\u{0}").as_deref(),
            Some("Eve Bcc: x@y.z")
        );
        assert_eq!(display_name(" \r\n\t "), None);
        assert_eq!(display_name("Иванов Пётр").as_deref(), Some("Иванов Пётр"));
    }

    #[tokio::test]
    async fn the_templates_load_and_undefined_variables_are_errors() {
        let env = templates().expect("templates load");
        let broken = env.render_str("{{ missing }}", minijinja::context! {});
        assert!(broken.is_err());
    }
}
