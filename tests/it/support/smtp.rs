//! A small SMTP server on port 0 standing in for a mail relay: it speaks enough
//! ESMTP for lettre, records every message it is given (accepted or not) and
//! answers from a script, so tests can see a 451 and the retry that follows.

use std::collections::VecDeque;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};

use base64::Engine as _;
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::net::TcpStream;

const OK_QUEUED: &str = "250 2.0.0 Ok: queued";

/// One message as the sink received it after DATA.
#[derive(Debug, Clone)]
pub struct Mail {
    pub mail_from: String,
    pub rcpt_to: Vec<String>,
    /// The message as sent, dot-unstuffed, CRLF line ends.
    pub data: String,
    /// What the sink answered to it.
    pub reply: String,
}

impl Mail {
    pub fn accepted(&self) -> bool {
        self.reply.starts_with('2')
    }

    /// The top-level header block, unfolded: one `(name, value)` per header.
    pub fn headers(&self) -> Vec<(String, String)> {
        parse_headers(self.data.split("\r\n\r\n").next().unwrap_or_default())
    }

    /// The value of the first top-level header called `name` (any case).
    pub fn header(&self, name: &str) -> Option<String> {
        self.headers()
            .into_iter()
            .find(|(n, _)| n.eq_ignore_ascii_case(name))
            .map(|(_, v)| v)
    }

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

fn parse_headers(block: &str) -> Vec<(String, String)> {
    let mut headers: Vec<(String, String)> = Vec::new();
    for line in block.split("\r\n") {
        if line.starts_with([' ', '\t']) {
            if let Some((_, value)) = headers.last_mut() {
                value.push(' ');
                value.push_str(line.trim());
            }
        } else if let Some((name, value)) = line.split_once(':') {
            headers.push((name.trim().to_owned(), value.trim().to_owned()));
        }
    }
    headers
}

#[derive(Debug, Default)]
struct Script {
    /// Answers to the end of DATA, in order; then `250`.
    data_replies: VecDeque<String>,
    /// When set, every RCPT TO gets this answer.
    rcpt_reply: Option<String>,
    /// When set, AUTH PLAIN is advertised and answered with this.
    auth_reply: Option<String>,
    mails: Vec<Mail>,
}

type Shared = Arc<Mutex<Script>>;

/// The running server; stops accepting when dropped.
#[derive(Debug)]
pub struct SmtpSink {
    addr: SocketAddr,
    script: Shared,
    task: tokio::task::JoinHandle<()>,
}

impl SmtpSink {
    pub async fn start() -> SmtpSink {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind the SMTP sink");
        let addr = listener.local_addr().expect("sink address");
        let script = Shared::default();
        let shared = Arc::clone(&script);
        let task = tokio::spawn(async move {
            while let Ok((stream, _)) = listener.accept().await {
                tokio::spawn(session(stream, Arc::clone(&shared)));
            }
        });
        SmtpSink { addr, script, task }
    }

    /// `smtp://127.0.0.1:{port}`: plain SMTP, as for a local sink.
    pub fn url(&self) -> String {
        format!("smtp://{}", self.addr)
    }

    pub fn port(&self) -> u16 {
        self.addr.port()
    }

    /// The next messages get these answers after DATA, in order.
    pub fn answer_data_with<'a>(&self, replies: impl IntoIterator<Item = &'a str>) {
        let mut script = self.script.lock().expect("sink state");
        script
            .data_replies
            .extend(replies.into_iter().map(str::to_owned));
    }

    /// Every RCPT TO gets `reply` (e.g. a 550).
    pub fn answer_rcpt_with(&self, reply: &str) {
        self.script.lock().expect("sink state").rcpt_reply = Some(reply.to_owned());
    }

    /// Advertises AUTH PLAIN and answers every AUTH with `reply`.
    pub fn answer_auth_with(&self, reply: &str) {
        self.script.lock().expect("sink state").auth_reply = Some(reply.to_owned());
    }

    /// Every message received after DATA, accepted or not, oldest first.
    pub fn mails(&self) -> Vec<Mail> {
        self.script.lock().expect("sink state").mails.clone()
    }

    pub fn accepted(&self) -> Vec<Mail> {
        self.mails().into_iter().filter(Mail::accepted).collect()
    }
}

impl Drop for SmtpSink {
    fn drop(&mut self) {
        self.task.abort();
    }
}

async fn session(stream: TcpStream, script: Shared) {
    let (read, mut write) = stream.into_split();
    let mut lines = BufReader::new(read);
    let mut mail_from = String::new();
    let mut rcpt_to: Vec<String> = Vec::new();
    macro_rules! reply {
        ($text:expr) => {
            if write
                .write_all(format!("{}\r\n", $text).as_bytes())
                .await
                .is_err()
            {
                return;
            }
        };
    }
    reply!("220 sink.test ESMTP ready");
    loop {
        let Some(line) = read_line(&mut lines).await else {
            return;
        };
        let verb = line
            .split_whitespace()
            .next()
            .unwrap_or_default()
            .to_ascii_uppercase();
        let argument = line.get(verb.len()..).unwrap_or_default().trim().to_owned();
        match verb.as_str() {
            "EHLO" => {
                let auth = script.lock().expect("sink state").auth_reply.is_some();
                reply!("250-sink.test");
                reply!("250-8BITMIME");
                if auth {
                    reply!("250-AUTH PLAIN");
                }
                reply!("250 SMTPUTF8");
            }
            "HELO" => reply!("250 sink.test"),
            "AUTH" => {
                let answer = script.lock().expect("sink state").auth_reply.clone();
                reply!(answer.unwrap_or_else(|| "503 5.5.1 AUTH not offered".to_owned()));
            }
            "MAIL" => {
                mail_from = argument;
                rcpt_to.clear();
                reply!("250 2.1.0 Ok");
            }
            "RCPT" => {
                let answer = script.lock().expect("sink state").rcpt_reply.clone();
                match answer {
                    Some(answer) => reply!(answer),
                    None => {
                        rcpt_to.push(argument);
                        reply!("250 2.1.5 Ok");
                    }
                }
            }
            "DATA" if rcpt_to.is_empty() => reply!("554 5.5.1 No valid recipients"),
            "DATA" => {
                reply!("354 End data with <CR><LF>.<CR><LF>");
                let mut data = Vec::new();
                loop {
                    let Some(line) = read_line(&mut lines).await else {
                        return;
                    };
                    if line == "." {
                        break;
                    }
                    data.push(line.strip_prefix('.').map_or(line.clone(), str::to_owned));
                }
                let answer = {
                    let mut script = script.lock().expect("sink state");
                    let answer = script
                        .data_replies
                        .pop_front()
                        .unwrap_or_else(|| OK_QUEUED.to_owned());
                    script.mails.push(Mail {
                        mail_from: mail_from.clone(),
                        rcpt_to: std::mem::take(&mut rcpt_to),
                        data: data.join("\r\n"),
                        reply: answer.clone(),
                    });
                    answer
                };
                reply!(answer);
            }
            "RSET" => {
                mail_from.clear();
                rcpt_to.clear();
                reply!("250 2.0.0 Ok");
            }
            "NOOP" => reply!("250 2.0.0 Ok"),
            "QUIT" => {
                reply!("221 2.0.0 Bye");
                return;
            }
            _ => reply!("502 5.5.2 Command not recognized"),
        }
    }
}

/// One line without its CRLF; `None` at end of stream.
async fn read_line(reader: &mut BufReader<tokio::net::tcp::OwnedReadHalf>) -> Option<String> {
    let mut buf = Vec::new();
    match reader.read_until(b'\n', &mut buf).await {
        Ok(0) | Err(_) => None,
        Ok(_) => {
            let line = String::from_utf8_lossy(&buf);
            Some(line.trim_end_matches(['\r', '\n']).to_owned())
        }
    }
}
