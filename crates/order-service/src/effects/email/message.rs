//! How a job's email is written: the embedded templates, the view they
//! render, the recipient's name and the headers.

use lettre::message::header::ContentType;
use lettre::message::header::{HeaderName, HeaderValue};
use lettre::message::{Attachment, Mailbox, MultiPart};
use lettre::{Address, Message};
use minijinja::{Environment, UndefinedBehavior};
use serde::Serialize;

use super::{EffectError, EmailKind, Mailer};
use crate::orders::{Order, OrderId};

/// Embedded, so the binary needs no `templates/` directory at run time. The
/// `.html` extension turns on minijinja's HTML auto-escaping for that template.
const TEMPLATES: [(&str, &str); 12] = [
    (
        "layout.html",
        include_str!("../../../../../templates/email/layout.html"),
    ),
    (
        "items.html",
        include_str!("../../../../../templates/email/items.html"),
    ),
    (
        "confirmation.txt",
        include_str!("../../../../../templates/email/confirmation.txt"),
    ),
    (
        "confirmation.html",
        include_str!("../../../../../templates/email/confirmation.html"),
    ),
    (
        "shipped.txt",
        include_str!("../../../../../templates/email/shipped.txt"),
    ),
    (
        "shipped.html",
        include_str!("../../../../../templates/email/shipped.html"),
    ),
    (
        "cancelled.txt",
        include_str!("../../../../../templates/email/cancelled.txt"),
    ),
    (
        "cancelled.html",
        include_str!("../../../../../templates/email/cancelled.html"),
    ),
    (
        "refunded.txt",
        include_str!("../../../../../templates/email/refunded.txt"),
    ),
    (
        "refunded.html",
        include_str!("../../../../../templates/email/refunded.html"),
    ),
    (
        "expired.txt",
        include_str!("../../../../../templates/email/expired.txt"),
    ),
    (
        "expired.html",
        include_str!("../../../../../templates/email/expired.html"),
    ),
];

impl Mailer {
    pub(super) fn compose(
        &self,
        job_id: i64,
        order: &Order,
        kind: EmailKind,
        details: &serde_json::Value,
        receipt: Option<Vec<u8>>,
    ) -> Result<Message, EffectError> {
        let address: Address = order.customer_email.parse().map_err(|e| {
            EffectError::permanent(format!(
                "recipient {:?} of order {} is not an email address: {e}",
                order.customer_email, order.id
            ))
        })?;
        let to = Mailbox::new(display_name(&order.customer_name), address);
        let mut view = ConfirmationView::new(
            order,
            &self.receipt_url(order.id.get(), crate::links::unix_now()),
            &self.from,
        )?;
        let detail = |name: &str| {
            details
                .get(name)
                .and_then(serde_json::Value::as_str)
                .map(str::to_owned)
        };
        view.carrier = detail("carrier");
        view.tracking_number = detail("tracking_number");
        view.reason = detail("reason");
        view.expires_at = detail("expires_at").map(|at| readable_time(&at));
        view.receipt_attached = receipt.is_some();
        let render = |name: &str| {
            self.templates
                .get_template(name)
                .and_then(|t| t.render(minijinja::value::Serde(&view)))
                .map_err(|e| {
                    EffectError::permanent(format!("email template {name} does not render: {e}"))
                })
        };
        let text = render(&format!("{}.txt", kind.name()))?;
        let html = render(&format!("{}.html", kind.name()))?;
        let mut message = Message::builder()
            .from(self.from.clone())
            .to(to)
            .subject(kind.subject(order.id))
            .message_id(Some(self.message_id(job_id, kind)));
        // The job's trace, for whoever follows the mail back to its order.
        if let Some(traceparent) = crate::trace_context::current_traceparent() {
            message = message.raw_header(HeaderValue::new(
                HeaderName::new_from_ascii_str("traceparent"),
                traceparent,
            ));
        }
        let body = MultiPart::alternative_plain_html(text, html);
        let body = match receipt {
            None => body,
            // The body first, so a client shows it and lists the PDF under
            // it; lettre base64-encodes a binary body.
            Some(pdf) => MultiPart::mixed().multipart(body).singlepart(
                Attachment::new(super::receipt_file_name(order.id)).body(
                    pdf,
                    ContentType::parse("application/pdf").map_err(|e| {
                        EffectError::permanent(format!("the PDF content type: {e}"))
                    })?,
                ),
            ),
        };
        message.multipart(body).map_err(|e| {
            EffectError::permanent(format!(
                "confirmation for order {} cannot be built: {e}",
                order.id
            ))
        })
    }

    /// `PUBLIC_BASE_URL/orders/{id}/receipt.pdf`, keeping any path prefix of
    /// the base, signed to expire `RECEIPT_LINK_TTL` after `now` (unix seconds).
    pub(super) fn receipt_url(&self, order_id: i64, now: u64) -> String {
        let mut url = self.public_base_url.clone();
        if let Ok(mut path) = url.path_segments_mut() {
            path.pop_if_empty()
                .extend(["orders", &order_id.to_string(), "receipt.pdf"]);
        }
        if let Some(links) = &self.receipt_links {
            url.set_query(Some(&links.sign(order_id, now).query()));
        }
        url.to_string()
    }
}

pub(super) fn templates() -> Result<Environment<'static>, minijinja::Error> {
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
    order_id: OrderId,
    items: Vec<ItemView>,
    total: String,
    receipt_url: String,
    /// The sender's display name, signed under the message.
    shop: Option<String>,
    /// For the shipped email.
    carrier: Option<String>,
    tracking_number: Option<String>,
    /// For the cancelled and refunded emails.
    reason: Option<String>,
    /// For the expired email: when the payment window closed.
    expires_at: Option<String>,
    /// Whether the message carries the receipt as `receipt-<order id>.pdf`.
    receipt_attached: bool,
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
        let currency = order.currency;
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
            expires_at: None,
            receipt_attached: false,
        })
    }
}

/// An event's RFC 3339 time as a customer reads it (`2026-12-12 10:30 UTC`);
/// the text as it came when it does not parse.
fn readable_time(rfc3339: &str) -> String {
    chrono::DateTime::parse_from_rfc3339(rfc3339).map_or_else(
        |_| rfc3339.to_owned(),
        |at| {
            at.with_timezone(&chrono::Utc)
                .format("%Y-%m-%d %H:%M UTC")
                .to_string()
        },
    )
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

#[cfg(test)]
mod tests {
    use super::*;

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
