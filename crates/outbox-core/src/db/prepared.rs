//! Raw SQL that Diesel prepares once per connection.
//!
//! `diesel::sql_query` marks every statement unsafe to cache, and so does a
//! multi-row insert, so PostgreSQL parses and plans them on every call: for
//! a statement of a few CTEs that is as much work as running it, on a core
//! the caller shares with the server. A statement whose text never changes
//! (an `include_str!` file, its binds as parameters) is safe to keep:
//! [`Prepared`] keeps it in the connection's statement cache, keyed by its
//! text and bind types, as Diesel keeps its typed queries. A multi-row
//! insert has one text per row count and per set of columns left to their
//! default, so [`prepare_insert`] keeps only a bounded number of them.

use std::collections::HashSet;
use std::hash::{DefaultHasher, Hash, Hasher};
use std::sync::{Mutex, OnceLock};

use diesel::pg::Pg;
use diesel::query_builder::{AstPass, Query, QueryFragment, QueryId};
use diesel::{QueryResult, RunQueryDsl};

/// A query (`diesel::sql_query(SQL).bind(..)…`, or a multi-row insert of a
/// few rows) that is prepared once per connection. Only for SQL whose text
/// takes few forms: each form is a statement of its own in the cache, for
/// the connection's life.
#[derive(Debug, Clone, Copy)]
#[must_use = "queries are only executed when calling `load`, `get_result`, or similar"]
pub struct Prepared<Q>(Q);

/// `.prepared()` on a raw query.
pub trait PrepareOnce: Sized {
    /// This query, kept in the connection's statement cache after its first call.
    fn prepared(self) -> Prepared<Self> {
        Prepared(self)
    }
}

impl<Q: QueryFragment<Pg>> PrepareOnce for Q {}

impl<Q: QueryFragment<Pg>> QueryFragment<Pg> for Prepared<Q> {
    fn walk_ast<'b>(&'b self, pass: AstPass<'_, 'b, Pg>) -> QueryResult<()> {
        self.0.walk_ast(pass)
    }

    fn is_safe_to_cache_prepared(&self, _backend: &Pg) -> QueryResult<bool> {
        Ok(true)
    }
}

/// No static id: Diesel keys the cache by the SQL text and the bind types.
impl<Q> QueryId for Prepared<Q> {
    type QueryId = ();
    const HAS_STATIC_QUERY_ID: bool = false;
}

impl<Q: Query> Query for Prepared<Q> {
    type SqlType = Q::SqlType;
}

impl<Conn, Q> RunQueryDsl<Conn> for Prepared<Q> {}

/// The most rows of a multi-row insert that is kept prepared: the few an
/// enqueue of one transaction writes, not a bulk load.
const PREPARED_INSERT_ROWS: usize = 8;

/// The most distinct insert texts kept prepared, in the whole process and so
/// on each connection: Diesel's statement cache never evicts.
const PREPARED_INSERT_FORMS: usize = 32;

/// Whether a multi-row insert is run [`Prepared`]. `shapes` has one item per
/// row: a mask of the optional columns the row writes (Diesel writes
/// `DEFAULT` for the others, so each sequence of masks is a text of its
/// own). Yes for a form already kept, and for a new one while fewer than
/// `PREPARED_INSERT_FORMS` (32) are; no for inserts of more than
/// `PREPARED_INSERT_ROWS` (8) rows.
pub fn prepare_insert(shapes: impl ExactSizeIterator<Item = u32>) -> bool {
    static FORMS: OnceLock<Mutex<HashSet<u64>>> = OnceLock::new();
    if shapes.len() > PREPARED_INSERT_ROWS {
        return false;
    }
    let mut hasher = DefaultHasher::new();
    for shape in shapes {
        shape.hash(&mut hasher);
    }
    let form = hasher.finish();
    // A poisoned set is still a set of forms: nothing in it is half-written.
    let mut forms = FORMS
        .get_or_init(Mutex::default)
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner());
    forms.contains(&form) || (forms.len() < PREPARED_INSERT_FORMS && forms.insert(form))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_bounded_number_of_small_insert_forms_is_prepared() {
        assert!(!prepare_insert(
            [0u32; PREPARED_INSERT_ROWS + 1].into_iter()
        ));
        // Kept forms stay prepared; new ones stop once the bound is reached
        // (other tests may have added forms of their own to the set).
        assert!(prepare_insert([1u32, 2].into_iter()));
        let mut kept = 0;
        for shape in 0..(2 * PREPARED_INSERT_FORMS as u32) {
            if prepare_insert([shape, shape, shape].into_iter()) {
                kept += 1;
            }
        }
        assert!(kept < PREPARED_INSERT_FORMS, "{kept} new forms kept");
        assert!(prepare_insert([1u32, 2].into_iter()));
        assert!(
            !prepare_insert([u32::MAX, 0].into_iter()),
            "a form past the bound"
        );
    }
}
