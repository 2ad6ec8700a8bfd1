//! The SMTP sink the tests talk to: the library's
//! (`outbox_dev_tools::demo::sinks::smtp`, also the demo's), with what tests need on
//! top: a panic instead of an error when it cannot start, and `Mail::part` to
//! read one decoded MIME part.

use base64::Engine as _;
use outbox_dev_tools::demo::sinks::smtp::{self as sink, parse_headers};

/// One message as the sink received it: the library's [`sink::Mail`] (its
/// fields and header accessors through `Deref`), plus [`Mail::part`].
#[derive(Debug, Clone)]
pub struct Mail(sink::Mail);

impl From<sink::Mail> for Mail {
    fn from(mail: sink::Mail) -> Mail {
        Mail(mail)
    }
}

impl std::ops::Deref for Mail {
    type Target = sink::Mail;
    fn deref(&self) -> &sink::Mail {
        &self.0
    }
}

impl Mail {
    /// The decoded body of the first MIME part whose Content-Type starts with
    /// `content_type` (e.g. `text/html`).
    pub fn part(&self, content_type: &str) -> Option<String> {
        let boundary = self
            .header("content-type")?
            .split(';')
            .filter_map(|p| p.trim().strip_prefix("boundary="))
            .map(|b| b.trim_matches('"').to_owned())
            .next()?;
        let delimiter = format!("--{boundary}");
        self.data
            .split(delimiter.as_str())
            .skip(1)
            .find_map(|part| {
                let (head, body) = part.split_once("\r\n\r\n")?;
                let headers = parse_headers(head.trim_start_matches("\r\n"));
                let get = |name: &str| {
                    headers
                        .iter()
                        .find(|(n, _)| n.eq_ignore_ascii_case(name))
                        .map(|(_, v)| v.to_ascii_lowercase())
                        .unwrap_or_default()
                };
                if !get("content-type").starts_with(content_type) {
                    return None;
                }
                let body = body.strip_suffix("\r\n").unwrap_or(body);
                let bytes = match get("content-transfer-encoding").as_str() {
                    "base64" => base64::engine::general_purpose::STANDARD
                        .decode(body.replace(['\r', '\n'], ""))
                        .expect("valid base64 part"),
                    "quoted-printable" => {
                        quoted_printable::decode(body, quoted_printable::ParseMode::Strict)
                            .expect("valid quoted-printable part")
                    }
                    _ => body.as_bytes().to_vec(),
                };
                Some(String::from_utf8(bytes).expect("UTF-8 part"))
            })
    }
}

/// The running server on port 0; stops accepting when dropped.
#[derive(Debug)]
pub struct SmtpSink(sink::SmtpSink);

impl SmtpSink {
    pub async fn start() -> SmtpSink {
        SmtpSink(
            sink::SmtpSink::start(None)
                .await
                .expect("start the SMTP sink"),
        )
    }

    /// `smtp://127.0.0.1:{port}`: plain SMTP, as for a local sink.
    pub fn url(&self) -> String {
        self.0.url()
    }

    pub fn port(&self) -> u16 {
        self.0.addr().port()
    }

    /// The next messages get these answers after DATA, in order.
    pub fn answer_data_with<'a>(&self, replies: impl IntoIterator<Item = &'a str>) {
        self.0.answer_data_with(replies);
    }

    /// Every RCPT TO gets `reply` (e.g. a 550).
    pub fn answer_rcpt_with(&self, reply: &str) {
        self.0.answer_rcpt_with(reply);
    }

    /// Advertises AUTH PLAIN and answers every AUTH with `reply`.
    pub fn answer_auth_with(&self, reply: &str) {
        self.0.answer_auth_with(reply);
    }

    /// Every message received after DATA, accepted or not, oldest first.
    pub fn mails(&self) -> Vec<Mail> {
        self.0.mails().into_iter().map(Mail::from).collect()
    }

    pub fn accepted(&self) -> Vec<Mail> {
        self.mails()
            .into_iter()
            .filter(|mail| mail.accepted())
            .collect()
    }
}
