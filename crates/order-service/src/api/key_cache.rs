//! Keys that `POST /orders` let in a moment ago, so that a placement costs
//! one round trip, not two: the key's look-up before the body is read, then
//! the placement.
//!
//! The cache never decides on its own. A key it holds is let in before the
//! body is read, as the look-up would have, and the placement's statement
//! then checks the key's row again, in the same statement that writes the
//! order (`orders/sql/place_order_as_key.sql`): a key revoked or expired
//! since places nothing, and the request is answered `401` as before. A
//! request that ends any other way (a bad body, an idempotent repeat, the
//! pool's path) reads the key's row before it answers (`auth::confirm`). So
//! `keys revoke` still holds from the next request on, on every replica.
//!
//! Only keys that passed the look-up with the place scope are held, so a
//! made-up key is still refused before its body is read, at the cost of one
//! index probe. An entry lives [`FRESH_FOR`]: the look-up that renews it also
//! moves the key's `last_used_at`, as often as without the cache.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use chrono::{DateTime, Utc};

use super::auth::Reads;

/// How long a look-up lets a key in without another. The same as the
/// granularity of `last_used_at`, which only a look-up moves.
const FRESH_FOR: Duration = Duration::from_secs(60);

/// The most keys held. Only real keys get in, so this is far above any
/// shop's; a full cache drops its stale entries, then all of them.
const MAX_KEYS: usize = 4096;

/// A key the look-up let in for `POST /orders`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct CachedKey {
    pub id: i64,
    pub reads: Reads,
}

#[derive(Debug, Clone, Copy)]
struct Entry {
    key: CachedKey,
    expires_at: Option<DateTime<Utc>>,
    looked_up: Instant,
}

/// Keys by the SHA-256 of their secret, as `api_keys` stores them.
#[derive(Debug, Default)]
pub(crate) struct KeyCache {
    entries: Mutex<HashMap<[u8; 32], Entry>>,
}

impl KeyCache {
    /// The key with this hash, if a look-up let it in less than
    /// [`FRESH_FOR`] ago and it has not expired since.
    pub fn get(&self, sha256: &[u8; 32]) -> Option<CachedKey> {
        let entries = self.entries.lock().unwrap_or_else(|e| e.into_inner());
        let entry = entries.get(sha256)?;
        let fresh = entry.looked_up.elapsed() < FRESH_FOR
            && entry.expires_at.is_none_or(|at| at > Utc::now());
        fresh.then_some(entry.key)
    }

    /// Notes a key the look-up just let in.
    pub fn insert(&self, sha256: [u8; 32], key: CachedKey, expires_at: Option<DateTime<Utc>>) {
        let mut entries = self.entries.lock().unwrap_or_else(|e| e.into_inner());
        if entries.len() >= MAX_KEYS && !entries.contains_key(&sha256) {
            entries.retain(|_, entry| entry.looked_up.elapsed() < FRESH_FOR);
            if entries.len() >= MAX_KEYS {
                entries.clear();
            }
        }
        let looked_up = Instant::now();
        entries.insert(
            sha256,
            Entry {
                key,
                expires_at,
                looked_up,
            },
        );
    }

    /// Forgets a key its row refused.
    pub fn remove(&self, sha256: &[u8; 32]) {
        let mut entries = self.entries.lock().unwrap_or_else(|e| e.into_inner());
        entries.remove(sha256);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const KEY: CachedKey = CachedKey {
        id: 7,
        reads: Reads::All,
    };

    #[test]
    fn a_key_is_held_until_it_expires_or_is_removed() {
        let cache = KeyCache::default();
        assert_eq!(cache.get(&[1; 32]), None);
        cache.insert([1; 32], KEY, None);
        assert_eq!(cache.get(&[1; 32]), Some(KEY));
        cache.remove(&[1; 32]);
        assert_eq!(cache.get(&[1; 32]), None);

        let expired = Utc::now() - chrono::Duration::seconds(1);
        cache.insert([2; 32], KEY, Some(expired));
        assert_eq!(cache.get(&[2; 32]), None, "an expired key is not let in");
    }

    #[test]
    fn a_full_cache_makes_room() {
        let cache = KeyCache::default();
        for n in 0..MAX_KEYS {
            let mut hash = [0; 32];
            hash[..8].copy_from_slice(&(n as u64).to_le_bytes());
            cache.insert(hash, KEY, None);
        }
        cache.insert([9; 32], KEY, None);
        assert_eq!(cache.get(&[9; 32]), Some(KEY));
        let held = cache.entries.lock().map(|e| e.len()).unwrap_or(0);
        assert!(held <= MAX_KEYS, "{held} keys held");
    }
}
