//! Idempotency keys: what makes a placement or a transition safe to retry.

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
