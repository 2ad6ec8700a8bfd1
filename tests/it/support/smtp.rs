//! The SMTP sink the tests talk to: the library's
//! (`outbox_dev_tools::demo::sinks::smtp`, also the demo's), with what tests need on
//! top: a panic instead of an error when it cannot start, and `Mail::parsed` and
//! `Mail::part` to read the message with a real MIME parser.

use outbox_dev_tools::demo::sinks::smtp as sink;

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
    /// The message as a MIME parser reads it, nested parts and all.
    pub fn parsed(&self) -> mail_parser::Message<'_> {
        mail_parser::MessageParser::default()
            .parse(self.data.as_bytes())
            .unwrap_or_else(|| panic!("not a MIME message:\n{}", self.data))
    }

    /// The decoded body of the first leaf MIME part, at any depth (inside
    /// `multipart/mixed` too), whose Content-Type starts with `content_type`
    /// (e.g. `text/html`).
    pub fn part(&self, content_type: &str) -> Option<String> {
        use mail_parser::MimeHeaders as _;
        let message = self.parsed();
        message
            .parts
            .iter()
            .filter(|part| !part.is_multipart())
            .find(|part| {
                part.content_type().is_some_and(|ct| {
                    format!("{}/{}", ct.ctype(), ct.subtype().unwrap_or_default())
                        .to_ascii_lowercase()
                        .starts_with(content_type)
                })
            })
            .map(|part| {
                assert!(!part.is_encoding_problem, "a part that does not decode");
                String::from_utf8(part.contents().to_vec()).expect("UTF-8 part")
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
