//! Dashboard sessions: signed by a server key, kept in the database.
//!
//! The key is random, made once and kept in `admin_secrets`, so every `serve`
//! replica signs and checks with the same one and a restart keeps operators
//! logged in; it is not a login token, so a leaked cookie gives nothing to
//! guess a token from offline. Each login is a row in `admin_sessions`: the
//! cookie `{id}.{token index}.{expiry}.{MAC}` is honoured only while that row
//! is live, so logging out ends the session on the server, for every replica.
//! The MAC also covers a digest of the token that logged in, so removing or
//! rotating a token ends its sessions at once. A session unused for longer
//! than `ADMIN_SESSION_IDLE` is refused too (`last_used_at`).

use std::time::Duration;

use base64::Engine as _;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use diesel::prelude::*;
use diesel::sql_types::{Bool, Bytea, Double, Text};
use hmac::{Hmac, Mac as _};
use sha2::Sha256;

use crate::config::dashboard::AdminSettings;

type HmacSha256 = Hmac<Sha256>;

/// Bytes of a fresh session key.
const KEY_BYTES: usize = 32;

/// The server's session key. `Debug` never shows it.
#[derive(Clone)]
pub(super) struct SessionKey(HmacSha256);

impl std::fmt::Debug for SessionKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("SessionKey(***)")
    }
}

impl SessionKey {
    pub fn new(bytes: &[u8]) -> anyhow::Result<SessionKey> {
        anyhow::ensure!(
            bytes.len() >= KEY_BYTES,
            "the stored session key is {} bytes, fewer than {KEY_BYTES}",
            bytes.len()
        );
        let mac = HmacSha256::new_from_slice(bytes)
            .map_err(|e| anyhow::anyhow!("the session key cannot key HMAC: {e}"))?;
        Ok(SessionKey(mac))
    }

    /// HMAC of `parts` for `purpose`, each part length-delimited by a NUL
    /// (none of them contains one).
    pub fn mac(&self, purpose: &str, parts: &[&[u8]]) -> HmacSha256 {
        let mut mac = self.0.clone();
        mac.update(purpose.as_bytes());
        for part in parts {
            mac.update(&[0]);
            mac.update(part);
        }
        mac
    }
}

#[derive(QueryableByName)]
struct KeyRow {
    #[diesel(sql_type = Bytea)]
    secret: Vec<u8>,
}

#[derive(QueryableByName)]
struct LiveRow {
    #[diesel(sql_type = Bool)]
    live: bool,
}

/// The session key, made now if this is the first `serve` to need one.
pub(super) fn load_or_create_key(conn: &mut PgConnection) -> anyhow::Result<Vec<u8>> {
    let mut fresh = [0_u8; KEY_BYTES];
    getrandom::fill(&mut fresh).map_err(|e| anyhow::anyhow!("no randomness for a key: {e}"))?;
    diesel::sql_query(include_str!("sql/insert_session_key.sql"))
        .bind::<Bytea, _>(fresh.as_slice())
        .execute(conn)?;
    let row: KeyRow = diesel::sql_query(include_str!("sql/session_key.sql")).get_result(conn)?;
    Ok(row.secret)
}

/// A cookie whose MAC holds; whether its session is live is the database's
/// to say ([`is_live`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct SignedSession {
    pub id: String,
    pub token_index: usize,
}

fn tag(key: &SessionKey, settings: &AdminSettings, body: &str, index: usize) -> Option<HmacSha256> {
    let token = settings.tokens.get(index)?;
    Some(key.mac("session", &[body.as_bytes(), &token.fingerprint]))
}

/// A new session for token `index`: its id and the cookie's value. The
/// caller stores it with [`insert`] before handing the cookie out.
pub(super) fn issue(
    key: &SessionKey,
    settings: &AdminSettings,
    index: usize,
    now: u64,
) -> anyhow::Result<(String, String)> {
    let mut id = [0_u8; 16];
    getrandom::fill(&mut id).map_err(|e| anyhow::anyhow!("no randomness for a session: {e}"))?;
    let id = hex::encode(id);
    let expires = now.saturating_add(settings.session_length.as_secs());
    let body = format!("{id}.{index}.{expires}");
    let tag = tag(key, settings, &body, index)
        .ok_or_else(|| anyhow::anyhow!("token {index} vanished"))?
        .finalize()
        .into_bytes();
    let value = format!("{body}.{}", URL_SAFE_NO_PAD.encode(tag));
    Ok((id, value))
}

/// The session a cookie value names, if its MAC holds for a configured token
/// and it has not expired.
pub(super) fn verify(
    key: &SessionKey,
    settings: &AdminSettings,
    value: &str,
    now: u64,
) -> Option<SignedSession> {
    let (body, given) = value.rsplit_once('.')?;
    let mut parts = body.splitn(3, '.');
    let id = parts.next()?;
    let index: usize = parts.next()?.parse().ok()?;
    let expires: u64 = parts.next()?.parse().ok()?;
    let given = URL_SAFE_NO_PAD.decode(given).ok()?;
    tag(key, settings, body, index)?.verify_slice(&given).ok()?;
    if expires <= now {
        return None;
    }
    Some(SignedSession {
        id: id.to_owned(),
        token_index: index,
    })
}

/// Stores a new session (and drops a batch of expired ones).
pub(super) fn insert(
    conn: &mut PgConnection,
    id: &str,
    actor: &str,
    length: Duration,
) -> QueryResult<()> {
    diesel::sql_query(include_str!("sql/delete_expired_sessions.sql")).execute(conn)?;
    diesel::sql_query(include_str!("sql/insert_session.sql"))
        .bind::<Text, _>(id)
        .bind::<Text, _>(actor)
        .bind::<Double, _>(length.as_secs_f64())
        .execute(conn)
        .map(drop)
}

/// Whether the session is honoured: present, unexpired, not logged out and
/// used within `idle`. Marks it used, at most once a minute, so that a busy
/// dashboard does not write a row per request.
pub(super) fn is_live(conn: &mut PgConnection, id: &str, idle: Duration) -> QueryResult<bool> {
    diesel::sql_query(include_str!("sql/session_is_live.sql"))
        .bind::<Text, _>(id)
        .bind::<Double, _>(idle.as_secs_f64())
        .get_result::<LiveRow>(conn)
        .map(|row| row.live)
}

pub(super) fn revoke(conn: &mut PgConnection, id: &str) -> QueryResult<()> {
    diesel::sql_query(include_str!("sql/revoke_session.sql"))
        .bind::<Text, _>(id)
        .execute(conn)
        .map(drop)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::dashboard::parse_admin_tokens;

    const NOW: u64 = 1_800_000_000;
    const ALPHA: &str = "alpha-token-0123456789abcdef-0123";
    const BETA: &str = "beta-token-0123456789abcdef-01234";

    fn settings(tokens: &str) -> AdminSettings {
        AdminSettings::new(parse_admin_tokens(Some(tokens), None).expect("tokens"))
    }

    fn key(byte: u8) -> SessionKey {
        SessionKey::new(&[byte; 32]).expect("key")
    }

    #[test]
    fn a_session_verifies_with_its_key_and_token_until_it_expires() {
        let settings = settings(&format!("op:{ALPHA},ro:{BETA}"));
        let (id, value) = issue(&key(1), &settings, 1, NOW).expect("issued");
        let session = verify(&key(1), &settings, &value, NOW).expect("genuine");
        assert_eq!(session, SignedSession { id, token_index: 1 });
        let length = settings.session_length.as_secs();
        assert!(verify(&key(1), &settings, &value, NOW + length).is_none());
        // Another server key (another database), or the token rotated.
        assert!(verify(&key(2), &settings, &value, NOW).is_none());
        let rotated = self::settings(&format!("op:{ALPHA},ro:gamma-token-0123456789abcdef-0123"));
        assert!(verify(&key(1), &rotated, &value, NOW).is_none());
    }

    #[test]
    fn a_changed_cookie_is_refused() {
        let settings = settings(&format!("op:{ALPHA},ro:{BETA}"));
        let (_, value) = issue(&key(1), &settings, 1, NOW).expect("issued");
        let mut parts: Vec<&str> = value.split('.').collect();
        parts[1] = "0";
        assert!(verify(&key(1), &settings, &parts.join("."), NOW).is_none());
        let longer = value.replacen(&format!(".{}.", NOW + 43_200), ".9999999999.", 1);
        assert!(verify(&key(1), &settings, &longer, NOW).is_none());
        for garbage in ["", "garbage", "a.b.c.d", "a.1.2.!!!"] {
            assert!(
                verify(&key(1), &settings, garbage, NOW).is_none(),
                "{garbage}"
            );
        }
    }

    #[test]
    fn the_cookie_carries_no_token_and_debug_hides_the_key() {
        let settings = settings(&format!("op:{ALPHA}"));
        let (_, value) = issue(&key(1), &settings, 0, NOW).expect("issued");
        assert!(!value.contains("alpha"));
        assert_eq!(format!("{:?}", key(1)), "SessionKey(***)");
        assert!(SessionKey::new(&[1; 31]).is_err());
    }
}
