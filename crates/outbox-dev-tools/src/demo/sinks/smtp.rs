//! A small SMTP server standing in for a mail relay: it speaks enough ESMTP for
//! lettre (and `swaks` or `curl smtp://`), records every message it is given,
//! accepted or not, and answers from a script, so a test can see a 451 and the
//! retry that follows. With a spool directory, each accepted message is also
//! written there as an `.eml` file that any mail client opens.
//!
//! It is a sink for local use: plain text, no authentication check, no relaying.
//!
//! # Why ours and not mailin-embedded
//!
//! Weighed against mailin-embedded 0.8 (with mailin 0.6), the SMTP server crate
//! made for embedding, and kept, because the tests and the demo need what it
//! cannot do:
//! - It cannot be stopped: `Server::serve` blocks its thread for good, on a
//!   scoped thread pool. The integration binary starts a sink per test and
//!   drops it at the end; each would leave a listener and its threads behind.
//!   This one is a tokio task, aborted when the [`SmtpSink`] is dropped.
//! - Sessions are capped by that pool (4 threads unless told otherwise), each
//!   on a blocking thread; the relay's lettre pool opens more connections than
//!   that, so the extra ones would wait behind the first four.
//! - Its session state machine writes the replies: a handler may choose a code
//!   and a text for MAIL, RCPT, DATA and AUTH, but AUTH is advertised only if
//!   it was enabled before `serve`, where a test here turns it on
//!   ([`SmtpSink::answer_auth_with`]) after the sink has started.
//! - It reads a line with no bound (`read_until` into a `Vec`); this one stops
//!   at `MAX_LINE_BYTES` (64 KiB) and keeps at most [`MAX_MESSAGE_BYTES`].
//! - It does not build without a TLS backend, and its rustls one brings
//!   rustls-pemfile, which RustSec lists as unmaintained (RUSTSEC-2025-0134),
//!   plus scoped_threadpool, bufstream-fresh and log, none of which this crate
//!   needs otherwise.
//!
//! The hostile replies of the hardening tests (a NUL, escape bytes, 100 KB of
//! text after a 550) it could send as `Response::custom`; the rest decides it.

use std::collections::VecDeque;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::{Arc, Mutex, MutexGuard};

use tokio::io::{AsyncBufReadExt, AsyncReadExt as _, AsyncWriteExt, BufReader};
use tokio::net::TcpStream;
use tokio::net::tcp::OwnedReadHalf;

const OK_QUEUED: &str = "250 2.0.0 Ok: queued";
/// Longest command or data line read; SMTP itself caps lines at 1000 octets.
const MAX_LINE_BYTES: u64 = 64 * 1024;
/// Largest message kept; a bigger one is read to its end and refused with 552.
pub const MAX_MESSAGE_BYTES: usize = 25 * 1024 * 1024;

/// One message as the sink received it after DATA.
#[derive(Debug, Clone)]
pub struct Mail {
    pub mail_from: String,
    pub rcpt_to: Vec<String>,
    /// The message as sent, dot-unstuffed, CRLF line ends.
    pub data: String,
    /// What the sink answered to it.
    pub reply: String,
    /// The `.eml` file it was written to, when the sink has a spool directory
    /// and accepted it.
    pub saved_as: Option<PathBuf>,
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
}

/// Unfolds a header block (CRLF line ends) into `(name, value)` pairs.
pub fn parse_headers(block: &str) -> Vec<(String, String)> {
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
    /// Where accepted messages are written, if anywhere.
    spool: Option<PathBuf>,
    saved: u64,
    mails: Vec<Mail>,
}

#[derive(Debug, Clone, Default)]
struct Shared(Arc<Mutex<Script>>);

impl Shared {
    fn lock(&self) -> MutexGuard<'_, Script> {
        // Every critical section is a few field updates that cannot panic
        // half-way, so a poisoned lock still guards consistent data.
        self.0.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// The running server, on a loopback port of its own; stops accepting when dropped.
#[derive(Debug)]
pub struct SmtpSink {
    addr: SocketAddr,
    script: Shared,
    task: tokio::task::JoinHandle<()>,
}

impl SmtpSink {
    /// Listens on `127.0.0.1` on a free port. With `spool`, accepted messages
    /// are also written there as `NNNN-<message-id>.eml`.
    pub async fn start(spool: Option<PathBuf>) -> std::io::Result<SmtpSink> {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
        let addr = listener.local_addr()?;
        let script = Shared::default();
        script.lock().spool = spool;
        let shared = script.clone();
        let task = tokio::spawn(async move {
            loop {
                match listener.accept().await {
                    Ok((stream, _)) => {
                        tokio::spawn(session(stream, shared.clone()));
                    }
                    // Out of file descriptors, or a connection reset before
                    // accept: the listener itself is still good.
                    Err(error) => {
                        tracing::warn!(error = %error, "SMTP sink: accept failed");
                        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
                    }
                }
            }
        });
        Ok(SmtpSink { addr, script, task })
    }

    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// `smtp://127.0.0.1:{port}`: plain SMTP, as for a local sink.
    pub fn url(&self) -> String {
        format!("smtp://{}", self.addr)
    }

    /// The next messages get these answers after DATA, in order.
    pub fn answer_data_with<'a>(&self, replies: impl IntoIterator<Item = &'a str>) {
        self.script
            .lock()
            .data_replies
            .extend(replies.into_iter().map(str::to_owned));
    }

    /// Every RCPT TO gets `reply` (e.g. a 550).
    pub fn answer_rcpt_with(&self, reply: &str) {
        self.script.lock().rcpt_reply = Some(reply.to_owned());
    }

    /// Advertises AUTH PLAIN and answers every AUTH with `reply`.
    pub fn answer_auth_with(&self, reply: &str) {
        self.script.lock().auth_reply = Some(reply.to_owned());
    }

    /// Every message received after DATA, accepted or not, oldest first.
    pub fn mails(&self) -> Vec<Mail> {
        self.script.lock().mails.clone()
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
                let auth = script.lock().auth_reply.is_some();
                reply!("250-sink.test");
                reply!("250-8BITMIME");
                if auth {
                    reply!("250-AUTH PLAIN");
                }
                reply!("250 SMTPUTF8");
            }
            "HELO" => reply!("250 sink.test"),
            "AUTH" => {
                let answer = script.lock().auth_reply.clone();
                reply!(answer.unwrap_or_else(|| "503 5.5.1 AUTH not offered".to_owned()));
            }
            "MAIL" => {
                mail_from = argument;
                rcpt_to.clear();
                reply!("250 2.1.0 Ok");
            }
            "RCPT" => {
                let answer = script.lock().rcpt_reply.clone();
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
                let mut data: Vec<String> = Vec::new();
                let mut size = 0usize;
                loop {
                    let Some(line) = read_line(&mut lines).await else {
                        return;
                    };
                    if line == "." {
                        break;
                    }
                    size += line.len() + 2;
                    if size <= MAX_MESSAGE_BYTES {
                        data.push(line.strip_prefix('.').map_or(line.clone(), str::to_owned));
                    }
                }
                let mail = Mail {
                    mail_from: mail_from.clone(),
                    rcpt_to: std::mem::take(&mut rcpt_to),
                    data: data.join("\r\n"),
                    reply: String::new(),
                    saved_as: None,
                };
                let answer = if size > MAX_MESSAGE_BYTES {
                    "552 5.3.4 Message too big".to_owned()
                } else {
                    script
                        .lock()
                        .data_replies
                        .pop_front()
                        .unwrap_or_else(|| OK_QUEUED.to_owned())
                };
                let mail = spool(&script, mail, answer).await;
                let answer = mail.reply.clone();
                script.lock().mails.push(mail);
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

/// Writes an accepted message to the spool directory, if there is one. A
/// message that cannot be written is deferred (451), as a real server that
/// cannot queue it would, so the sender keeps it and retries.
async fn spool(script: &Shared, mut mail: Mail, answer: String) -> Mail {
    mail.reply = answer;
    let target = {
        let mut script = script.lock();
        match script.spool.clone() {
            Some(dir) if mail.accepted() => {
                script.saved += 1;
                Some((dir, script.saved))
            }
            _ => None,
        }
    };
    let Some((dir, n)) = target else {
        return mail;
    };
    let stem = mail
        .header("message-id")
        .map(|id| {
            let id = id.trim_matches(['<', '>']);
            super::file_stem(id.split('@').next().unwrap_or(id))
        })
        .unwrap_or_else(|| "message".to_owned());
    let mut bytes = mail.data.clone().into_bytes();
    bytes.extend_from_slice(b"\r\n");
    match super::save(&dir, &format!("{n:04}-{stem}.eml"), bytes).await {
        Ok(path) => mail.saved_as = Some(path),
        Err(error) => {
            tracing::warn!(dir = %dir.display(), error = %error, "SMTP sink: cannot save a message");
            mail.reply = format!("451 4.3.0 Cannot save the message: {error}");
        }
    }
    mail
}

/// One line without its CRLF; `None` at end of stream or on a line longer
/// than [`MAX_LINE_BYTES`] (a client that is not speaking SMTP).
async fn read_line(reader: &mut BufReader<OwnedReadHalf>) -> Option<String> {
    let mut buf = Vec::new();
    match (&mut *reader)
        .take(MAX_LINE_BYTES)
        .read_until(b'\n', &mut buf)
        .await
    {
        Ok(0) | Err(_) => None,
        Ok(_) if !buf.ends_with(b"\n") && buf.len() as u64 >= MAX_LINE_BYTES => None,
        Ok(_) => {
            let line = String::from_utf8_lossy(&buf);
            Some(line.trim_end_matches(['\r', '\n']).to_owned())
        }
    }
}
