//! confirmation_email and order_email: a multipart text + HTML message over
//! SMTP (lettre).
//!
//! The `Message-ID` is derived from the job id and the email it sends
//! (`<job-42.shipped@shop.example>`), so every attempt of a job sends
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
//!
//! How a message is written (templates, the view they see, its headers) is
//! in `message`; this file holds the settings, the transport and the sending.

mod message;

use std::fmt;
use std::time::Duration;

use anyhow::{Context as _, anyhow};
use lettre::message::Mailbox;
use lettre::transport::smtp::Error as SmtpError;
use lettre::{AsyncSmtpTransport, AsyncTransport, Tokio1Executor};
use minijinja::Environment;

use self::message::templates;
use super::{EffectError, error_chain};
use crate::orders::{Order, OrderId};

/// Per SMTP command (connect, EHLO, MAIL, RCPT, DATA, ...). lettre's default is 60s.
pub const SMTP_COMMAND_TIMEOUT: Duration = Duration::from_secs(30);
/// For one whole send, including waiting for a pooled connection.
pub const SMTP_SEND_DEADLINE: Duration = Duration::from_secs(120);
/// The largest receipt PDF an email carries (2 MiB, about 2.7 MiB once
/// base64-encoded): larger ones stay behind the signed link, so that a
/// confirmation stays well under the message size limits mail servers
/// commonly set.
pub const MAX_RECEIPT_ATTACHMENT_BYTES: usize = 2 * 1024 * 1024;

/// The file name a receipt is attached under.
pub fn receipt_file_name(order_id: OrderId) -> String {
    format!("receipt-{order_id}.pdf")
}

/// Which email an event sends: the template's name and the subject.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EmailKind {
    Confirmation,
    Shipped,
    Cancelled,
    Refunded,
    Expired,
}

impl EmailKind {
    /// The email for an event type; `None` for events that mail nobody.
    pub fn for_event(event_type: &str) -> Option<EmailKind> {
        match event_type {
            "order.placed" => Some(EmailKind::Confirmation),
            "order.shipped" => Some(EmailKind::Shipped),
            "order.cancelled" => Some(EmailKind::Cancelled),
            "order.refunded" => Some(EmailKind::Refunded),
            "order.expired" => Some(EmailKind::Expired),
            _ => None,
        }
    }

    /// The email's name: its templates' (`shipped.txt`, `shipped.html`) and
    /// its `Message-ID`'s.
    pub fn name(self) -> &'static str {
        match self {
            EmailKind::Confirmation => "confirmation",
            EmailKind::Shipped => "shipped",
            EmailKind::Cancelled => "cancelled",
            EmailKind::Refunded => "refunded",
            EmailKind::Expired => "expired",
        }
    }

    fn subject(self, order_id: OrderId) -> String {
        match self {
            EmailKind::Confirmation => format!("Your order #{order_id} is confirmed"),
            EmailKind::Shipped => format!("Your order #{order_id} is on its way"),
            EmailKind::Cancelled => format!("Your order #{order_id} has been cancelled"),
            EmailKind::Refunded => format!("Your order #{order_id} has been refunded"),
            EmailKind::Expired => format!("Your order #{order_id} has expired unpaid"),
        }
    }
}

#[derive(Clone)]
pub struct EmailConfig {
    /// lettre's URL form; may carry credentials, so it is never printed whole.
    pub smtp_url: String,
    pub mail_from: String,
    pub public_base_url: String,
    /// Signs the receipt links in emails; `None` (only with `API_AUTH=none`)
    /// writes plain links to an open receipt route.
    pub receipt_links: Option<crate::links::ReceiptLinks>,
}

impl fmt::Debug for EmailConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("EmailConfig")
            .field("smtp_url", &crate::db::redact_url(&self.smtp_url))
            .field("mail_from", &self.mail_from)
            .field("public_base_url", &self.public_base_url)
            .field("receipt_links", &self.receipt_links)
            .finish()
    }
}

/// Sends an order's emails through one pooled SMTP transport.
pub struct Mailer {
    transport: AsyncSmtpTransport<Tokio1Executor>,
    from: Mailbox,
    /// Right-hand side of every `Message-ID`: the sender's domain.
    message_id_domain: String,
    public_base_url: url::Url,
    receipt_links: Option<crate::links::ReceiptLinks>,
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
                    crate::db::redact_url(&config.smtp_url)
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
            receipt_links: config.receipt_links.clone(),
            templates: templates().context("the embedded email templates do not load")?,
            password,
        })
    }

    /// Sends the confirmation of `order` as job `job_id`; returns the
    /// server's reply to the message ([`smtp_reply`]).
    pub async fn send_confirmation(
        &self,
        job_id: i64,
        order: &Order,
    ) -> Result<String, EffectError> {
        self.send(
            job_id,
            order,
            EmailKind::Confirmation,
            &serde_json::Value::Null,
        )
        .await
    }

    /// Sends the `kind` email of `order` as job `job_id`; `details` is the
    /// event's data (carrier and tracking number, reason). Returns the
    /// server's reply to the message ([`smtp_reply`]).
    pub async fn send(
        &self,
        job_id: i64,
        order: &Order,
        kind: EmailKind,
        details: &serde_json::Value,
    ) -> Result<String, EffectError> {
        self.send_with_receipt(job_id, order, kind, details, None)
            .await
    }

    /// [`Mailer::send`], with the order's receipt PDF attached as
    /// `receipt-<order id>.pdf` when `receipt` is some (the message is then
    /// `multipart/mixed`: the text and HTML alternative, then the PDF). The
    /// receipt link is in the body either way.
    pub async fn send_with_receipt(
        &self,
        job_id: i64,
        order: &Order,
        kind: EmailKind,
        details: &serde_json::Value,
        receipt: Option<Vec<u8>>,
    ) -> Result<String, EffectError> {
        let message = self.compose(job_id, order, kind, details, receipt)?;
        match tokio::time::timeout(SMTP_SEND_DEADLINE, self.transport.send(message)).await {
            Ok(Ok(response)) => Ok(self.scrub(&smtp_reply(&response))),
            Ok(Err(e)) => Err(self.classify(&e)),
            Err(_) => Err(EffectError::retryable(format!(
                "SMTP send did not finish within {}",
                humantime::format_duration(SMTP_SEND_DEADLINE)
            ))),
        }
    }

    /// `<job-{id}.{email}@{sender's domain}>`: the same for every attempt.
    pub fn message_id(&self, job_id: i64, kind: EmailKind) -> String {
        message_id_for(job_id, kind, &self.message_id_domain)
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

/// The server's reply to a message (its answer after DATA) on one line: the
/// code, then the text of every line of the reply, space-separated; what a
/// single-line reply said on the wire. Cleaned of control characters and
/// bounded, as it is stored in the effect ledger.
pub fn smtp_reply(response: &lettre::transport::smtp::response::Response) -> String {
    let text: Vec<&str> = response.message().collect();
    let line = format!("{} {}", response.code(), text.join(" "));
    crate::text::one_line(line.trim_end(), MAX_SMTP_REPLY_CHARS)
}

/// Characters of an SMTP reply kept in the effect ledger.
pub const MAX_SMTP_REPLY_CHARS: usize = 512;

/// The `Message-ID` of job `job_id`'s email `kind` when the sender's domain
/// is `domain`: the job and what it sends, so a reader (and a demo's spool of
/// `.eml` files) sees which email it is.
pub fn message_id_for(job_id: i64, kind: EmailKind, domain: &str) -> String {
    format!("<job-{job_id}.{}@{domain}>", kind.name())
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
            receipt_links: None,
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
        assert_eq!(
            mailer.message_id(42, EmailKind::Confirmation),
            "<job-42.confirmation@shop.example>"
        );
        assert_eq!(
            mailer.message_id(43, EmailKind::Cancelled),
            "<job-43.cancelled@shop.example>"
        );
        assert_eq!(
            mailer.receipt_url(7, 1_800_000_000),
            "https://shop.example/store/orders/7/receipt.pdf"
        );
    }

    #[tokio::test]
    async fn receipt_links_are_signed_when_a_key_is_set() {
        let links =
            crate::links::ReceiptLinks::new(&[7; 32], Duration::from_secs(60)).expect("key");
        let mailer = Mailer::new(&EmailConfig {
            receipt_links: Some(links.clone()),
            ..config()
        })
        .expect("valid config");
        let url = url::Url::parse(&mailer.receipt_url(7, 1_800_000_000)).expect("a URL");
        assert_eq!(url.path(), "/store/orders/7/receipt.pdf");
        let query: std::collections::HashMap<_, _> = url.query_pairs().collect();
        assert_eq!(query["expires"], "1800000060");
        assert_eq!(
            links.verify(
                7,
                &query["expires"],
                Some(&query["kid"]),
                &query["signature"],
                1_800_000_000
            ),
            Ok(())
        );
    }
}
