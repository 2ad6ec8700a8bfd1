//! The stored secrets as a whole: how many are sealed and under which key
//! (the warnings `serve` and `relay` log at start), and sealing every one
//! under the current key (`outbox-relay secrets seal`). Each value is sealed
//! and opened by [`crate::sealed`]; this module only walks the columns.

use std::collections::BTreeMap;

use diesel::prelude::*;
use diesel::sql_types::{BigInt, Nullable, Text};

use crate::sealed::{COLUMNS, Column, Keyring, SealError, Stored, Unreadable};

/// How many stored secrets there are: in plaintext, and sealed per key id.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Census {
    pub plaintext: u64,
    pub sealed: BTreeMap<String, u64>,
}

#[derive(QueryableByName)]
struct CensusRow {
    #[diesel(sql_type = Nullable<Text>)]
    key_id: Option<String>,
    #[diesel(sql_type = BigInt)]
    n: i64,
}

/// Counts the stored secrets of every endpoint and source.
pub fn census(conn: &mut PgConnection) -> QueryResult<Census> {
    let rows: Vec<CensusRow> = diesel::sql_query(include_str!("at_rest/census.sql")).load(conn)?;
    let mut census = Census::default();
    for row in rows {
        let n = u64::try_from(row.n).unwrap_or_default();
        match row.key_id {
            Some(id) => {
                census.sealed.insert(id, n);
            }
            None => census.plaintext = n,
        }
    }
    Ok(census)
}

impl Census {
    /// Sealed values `keys` cannot open, and the ids of their keys.
    fn unopenable(&self, keys: &Keyring) -> (u64, Vec<&str>) {
        let ids: Vec<&str> = self
            .sealed
            .keys()
            .map(String::as_str)
            .filter(|id| Some(*id) != keys.current_id() && Some(*id) != keys.previous_id())
            .collect();
        let count = ids.iter().filter_map(|id| self.sealed.get(*id)).sum();
        (count, ids)
    }

    /// Values under the previous key, which `secrets seal` moves.
    fn under_previous(&self, keys: &Keyring) -> u64 {
        keys.previous_id()
            .and_then(|id| self.sealed.get(id))
            .copied()
            .unwrap_or_default()
    }

    /// What an operator must hear at start: secrets this process cannot
    /// open, and, with a key set, secrets not yet sealed under it. Empty
    /// when all is as it should be.
    pub fn warnings(&self, keys: &Keyring) -> Vec<String> {
        let mut warnings = Vec::new();
        let (unopenable, ids) = self.unopenable(keys);
        if unopenable > 0 {
            let ids = ids.join(", ");
            warnings.push(match keys.current_id() {
                None => format!(
                    "{unopenable} stored secrets are sealed (key {ids}), but SECRETS_KEY is not \
                     set: deliveries to their endpoints and messages from their sources fail \
                     until it is"
                ),
                Some(current) => format!(
                    "{unopenable} stored secrets are sealed under key {ids}, which is neither \
                     SECRETS_KEY (key {current}) nor SECRETS_KEY_PREVIOUS: SECRETS_KEY is \
                     wrong, or the key they were sealed with is missing; deliveries to their \
                     endpoints and messages from their sources fail until it is set"
                ),
            });
        }
        let previous = self.under_previous(keys);
        if keys.seals() && self.plaintext + previous > 0 {
            let left: Vec<String> = [
                (self.plaintext, "in plaintext"),
                (previous, "under SECRETS_KEY_PREVIOUS"),
            ]
            .into_iter()
            .filter(|(n, _)| *n > 0)
            .map(|(n, how)| format!("{n} {how}"))
            .collect();
            warnings.push(format!(
                "stored secrets not sealed under SECRETS_KEY: {}; run `outbox-relay secrets \
                 seal` to seal them under it",
                left.join(", ")
            ));
        }
        warnings
    }
}

/// The one line `serve` and `relay` log at start without `SECRETS_KEY`,
/// before they touch the database.
pub fn warn_without_key(keys: &Keyring) {
    if !keys.seals() {
        tracing::warn!(
            "SECRETS_KEY is not set: the signing secrets, NATS credentials and API keys of \
             endpoints and sources are stored in the clear; to seal them, set SECRETS_KEY (32 random bytes: \
             `openssl rand -base64 32`) on every process and run `outbox-relay secrets seal` \
             (SECRETS_PLAINTEXT=refuse then refuses plaintext secrets altogether)"
        );
    }
}

/// Logs [`Census::warnings`] for the database at `conn`. A census that
/// cannot be read is itself a warning, never a reason not to start, unless
/// plaintext is refused: then a stored plaintext secret, or a census that
/// cannot say there is none, stops the start.
pub fn check_at_start(conn: &mut PgConnection, keys: &Keyring) -> Result<(), PlaintextStored> {
    let census = match census(conn) {
        Ok(census) => census,
        Err(error) if keys.refuses_plaintext() => return Err(error.into()),
        Err(error) => {
            tracing::warn!(%error, "cannot count the stored secrets");
            return Ok(());
        }
    };
    if keys.refuses_plaintext() && census.plaintext > 0 {
        return Err(PlaintextStored::Found(census.plaintext));
    }
    for warning in census.warnings(keys) {
        tracing::warn!(
            plaintext = census.plaintext,
            sealed = ?census.sealed,
            "{warning}"
        );
    }
    Ok(())
}

/// Why a start with `SECRETS_PLAINTEXT=refuse` stops.
#[derive(Debug, thiserror::Error)]
pub enum PlaintextStored {
    #[error(
        "SECRETS_PLAINTEXT=refuse, but {0} stored secrets are in plaintext: seal them first \
         (SECRETS_KEY=... outbox-relay secrets seal)"
    )]
    Found(u64),
    #[error("cannot count the stored secrets (SECRETS_PLAINTEXT=refuse needs to): {0}")]
    Database(#[from] diesel::result::Error),
}

/// Refuses to write a secret in plaintext where others are sealed: an
/// operator command run without `SECRETS_KEY` in its environment would
/// otherwise leave the new secret readable.
pub fn require_key_where_sealed(
    conn: &mut PgConnection,
    keys: &Keyring,
) -> Result<(), SealedWithoutKey> {
    if keys.seals() {
        return Ok(());
    }
    let census = census(conn)?;
    if census.sealed.is_empty() {
        return Ok(());
    }
    Err(SealedWithoutKey::Sealed(
        census.sealed.keys().cloned().collect::<Vec<_>>().join(", "),
    ))
}

/// Why a plaintext write is refused.
#[derive(Debug, thiserror::Error)]
pub enum SealedWithoutKey {
    #[error(
        "this database holds sealed secrets (key {0}) and SECRETS_KEY is not set: set it for \
         this command too, so that the new secret is sealed like the others"
    )]
    Sealed(String),
    #[error(transparent)]
    Database(#[from] diesel::result::Error),
}

/// What [`seal_all`] did, value by value.
#[derive(Debug, Default)]
pub struct SealReport {
    /// Plaintext values now sealed under the current key.
    pub sealed: u64,
    /// Values moved from the previous key to the current one.
    pub resealed: u64,
    /// Values already under the current key (each checked to open).
    pub unchanged: u64,
    /// Values no key of this process opens: left as they are.
    pub unreadable: Vec<Unreadable>,
}

/// Why [`seal_all`] stopped.
#[derive(Debug, thiserror::Error)]
pub enum SealAllError {
    #[error("SECRETS_KEY is not set: there is no key to seal with")]
    NoKey,
    #[error(transparent)]
    Seal(#[from] SealError),
    #[error(transparent)]
    Database(#[from] diesel::result::Error),
}

#[derive(QueryableByName)]
struct Id {
    #[diesel(sql_type = BigInt)]
    id: i64,
}

#[derive(QueryableByName)]
struct Value {
    #[diesel(sql_type = Text)]
    name: String,
    #[diesel(sql_type = Nullable<Text>)]
    value: Option<String>,
}

/// Seals every stored secret under the current key: plaintext ones, and
/// those under the previous key. One short transaction per row, its row
/// locked, so it runs beside live relays and APIs, and a second run finds
/// nothing to do. Values no key opens are reported, not touched.
pub fn seal_all(conn: &mut PgConnection, keys: &Keyring) -> Result<SealReport, SealAllError> {
    if !keys.seals() {
        return Err(SealAllError::NoKey);
    }
    let mut report = SealReport::default();
    for table in ["endpoints", "sources"] {
        let columns: Vec<Column> = COLUMNS.into_iter().filter(|c| c.table == table).collect();
        let ids: Vec<Id> =
            diesel::sql_query(format!("SELECT id FROM {table} ORDER BY id")).load(conn)?;
        for Id { id } in ids {
            conn.transaction(|conn| seal_row(conn, keys, &columns, id, &mut report))?;
        }
    }
    Ok(report)
}

fn seal_row(
    conn: &mut PgConnection,
    keys: &Keyring,
    columns: &[Column],
    id: i64,
    report: &mut SealReport,
) -> Result<(), SealAllError> {
    for &column in columns {
        let (table, name) = (column.table, column.name);
        let row: Option<Value> = diesel::sql_query(format!(
            "SELECT name, {name} AS value FROM {table} WHERE id = $1 FOR UPDATE"
        ))
        .bind::<BigInt, _>(id)
        .get_result(conn)
        .optional()?;
        // Removed since the ids were read, or nothing stored in this column.
        let Some(Value {
            name: owner,
            value: Some(stored),
        }) = row
        else {
            continue;
        };
        let place = column.at(id);
        let owner = match table {
            "endpoints" => format!("endpoint {owner:?}"),
            _ => format!("source {owner:?}"),
        };
        let state = keys.state_of(&stored);
        let plain = match keys.open(place, &stored) {
            Ok(plain) => plain,
            Err(error) => {
                report.unreadable.push(error.about(owner, column));
                continue;
            }
        };
        match state {
            Stored::Current => {
                report.unchanged += 1;
                continue;
            }
            Stored::Plaintext => report.sealed += 1,
            Stored::Previous | Stored::Unknown(_) => report.resealed += 1,
        }
        diesel::sql_query(format!("UPDATE {table} SET {name} = $2 WHERE id = $1"))
            .bind::<BigInt, _>(id)
            .bind::<Text, _>(keys.seal(place, &plain)?)
            .execute(conn)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sealed::SecretsKey;

    fn census(plaintext: u64, sealed: &[(&str, u64)]) -> Census {
        Census {
            plaintext,
            sealed: sealed
                .iter()
                .map(|(id, n)| ((*id).to_owned(), *n))
                .collect(),
        }
    }

    #[test]
    fn sealed_secrets_without_a_key_are_one_warning() {
        let warnings = census(2, &[("0a1b2c3d", 3)]).warnings(&Keyring::none());
        assert_eq!(warnings.len(), 1, "{warnings:?}");
        assert!(
            warnings[0].starts_with(
                "3 stored secrets are sealed (key 0a1b2c3d), but SECRETS_KEY is not set"
            ),
            "{warnings:?}"
        );
        // Plaintext alone, without a key, is how it has always been.
        assert!(census(5, &[]).warnings(&Keyring::none()).is_empty());
    }

    #[test]
    fn a_key_with_plaintext_left_or_another_key_warns_of_each() {
        let key = SecretsKey::generate().expect("a key");
        let current = key.id().to_owned();
        let keys = Keyring::with_key(key);
        assert!(census(0, &[(&current, 4)]).warnings(&keys).is_empty());
        let warnings = census(2, &[(&current, 4), ("0a1b2c3d", 1)]).warnings(&keys);
        assert_eq!(warnings.len(), 2, "{warnings:?}");
        assert!(warnings[0].contains("under key 0a1b2c3d"), "{warnings:?}");
        assert!(warnings[0].contains("SECRETS_KEY is wrong"), "{warnings:?}");
        assert!(
            warnings[1].starts_with("stored secrets not sealed under SECRETS_KEY: 2 in plaintext;"),
            "{warnings:?}"
        );
        assert!(
            warnings[1].contains("outbox-relay secrets seal"),
            "{warnings:?}"
        );
    }

    #[test]
    fn values_under_the_previous_key_ask_for_a_seal_run() {
        let (new, old) = (
            SecretsKey::generate().expect("a key"),
            SecretsKey::generate().expect("a key"),
        );
        let (new_id, old_id) = (new.id().to_owned(), old.id().to_owned());
        let keys = Keyring::new(Some(new), Some(old)).expect("a rotation");
        let warnings = census(0, &[(&new_id, 1), (&old_id, 2)]).warnings(&keys);
        assert_eq!(warnings.len(), 1, "{warnings:?}");
        assert!(
            warnings[0].contains("2 under SECRETS_KEY_PREVIOUS"),
            "{warnings:?}"
        );
    }
}
