//! Raw SQL that Diesel prepares once per connection.
//!
//! `diesel::sql_query` marks every statement unsafe to cache, so PostgreSQL
//! parses and plans it on every call. For the placement's one-statement CTE
//! that planning took as long as executing it (about 0.2 ms each, EXPLAIN's
//! own figures), on a core the API shares with the server. A statement whose
//! text never changes (an `include_str!` file, its binds as parameters) is
//! safe to keep: [`Prepared`] keeps it in the connection's statement cache,
//! keyed by its text and bind types, as Diesel keeps its typed queries.

use diesel::pg::Pg;
use diesel::query_builder::{AstPass, Query, QueryFragment, QueryId};
use diesel::sql_types::Untyped;
use diesel::{QueryResult, RunQueryDsl};

/// A raw query (`diesel::sql_query(SQL).bind(..)…`) that is prepared once
/// per connection. Only for SQL that is the same text on every call: a text
/// built from input would fill the cache with one statement per variant.
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

impl<Q> Query for Prepared<Q> {
    type SqlType = Untyped;
}

impl<Conn, Q> RunQueryDsl<Conn> for Prepared<Q> {}
