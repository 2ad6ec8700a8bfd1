//! Idempotency keys: what makes a placement or a transition safe to retry;
//! and the cause of a placement or a transition, recorded on its row.

/// What caused a placement or a transition: the API key that asked for it
/// (`None`: no key, as with `API_AUTH=none` or a library caller), or the
/// inbox message (a provider's payment or refund) it applies. Recorded on
/// the order's and the event's row whether or not an Idempotency-Key came
/// with it, so a key with `orders:read:own` reads exactly its own orders.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Cause {
    pub api_key_id: Option<i64>,
    pub inbox_message_id: Option<i64>,
}

impl Cause {
    pub fn api_key(id: i64) -> Cause {
        Cause {
            api_key_id: Some(id),
            inbox_message_id: None,
        }
    }

    /// A transition an inbox message applies.
    pub fn inbox_message(id: i64) -> Cause {
        Cause {
            api_key_id: None,
            inbox_message_id: Some(id),
        }
    }

    /// The cause a library caller's idempotency key implies.
    pub(super) fn of_key(key: Option<&IdempotencyKey>) -> Cause {
        Cause {
            api_key_id: key.and_then(IdempotencyKey::api_key_id),
            inbox_message_id: None,
        }
    }

    /// `key` in this cause's space: one source for the row's `api_key_id`.
    pub(super) fn scope(self, key: Option<&IdempotencyKey>) -> Option<IdempotencyKey> {
        key.map(|k| k.clone().scoped_to(self.api_key_id))
    }
}

/// A client-chosen key that makes `POST /orders` (and a transition) safe to
/// retry, in the space of the API key that sent it: two API keys may use the
/// same text and each gets its own order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IdempotencyKey {
    key: String,
    /// The API key the client sent it with; `None` (requests without API
    /// keys, `API_AUTH=none`, library callers) is one shared space.
    api_key_id: Option<i64>,
}

impl IdempotencyKey {
    pub const MAX_LEN: usize = 255;

    /// An unscoped key; see [`IdempotencyKey::scoped_to`].
    pub fn parse(raw: &str) -> Result<Self, String> {
        if raw.is_empty() || raw.len() > Self::MAX_LEN {
            return Err(format!("must be 1 to {} bytes", Self::MAX_LEN));
        }
        if !raw.chars().all(|c| c.is_ascii_graphic()) {
            return Err("must be printable ASCII without spaces".into());
        }
        Ok(IdempotencyKey {
            key: raw.to_owned(),
            api_key_id: None,
        })
    }

    /// This key in the space of API key `api_key_id`.
    pub fn scoped_to(self, api_key_id: Option<i64>) -> Self {
        IdempotencyKey { api_key_id, ..self }
    }

    pub fn as_str(&self) -> &str {
        &self.key
    }

    pub fn api_key_id(&self) -> Option<i64> {
        self.api_key_id
    }
}
