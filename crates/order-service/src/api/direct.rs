//! The API's own connections, for the statements of every `POST /orders`:
//! the key check and the placement, or the placement alone for a key the
//! API let in from its cache (`key_cache`), whose statement checks the key.
//!
//! Through the pool, each is a hand-off to a blocking thread and back, and a
//! placement pinged its connection first, a round trip of its own. Profiled
//! at saturation on two cores, the API spent about 390 µs of its own CPU per
//! order beyond HTTP's, a quarter of it in context switches and a tenth in
//! the blocking pool's hand-offs. Here both statements run prepared on
//! tokio-postgres connections (`outbox_core::db::OwnConnections`): each is
//! one round trip from the request's own task, and a connection that died
//! while idle says so (`is_closed`) without a ping.
//!
//! Everything else (reads, transitions, an idempotent repeat, the
//! dashboard) stays on the pool, and so does everything when no connection
//! of its own opens (a URL or TLS setting only libpq understands).

use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use tokio_postgres::{Client, Statement};

use crate::api_keys::Scope;
use crate::api_keys::{
    AUTHENTICATE_PARAMS, AUTHENTICATE_SQL, Authenticated, PresentedKey, TOUCH_PARAMS, TOUCH_SQL,
    authenticate_on,
};
use crate::db::{DbError, OwnConnection, OwnConnections, PgPool};
use crate::orders::{
    KeyChecked, PLACE_ORDER_AS_KEY_SQL, PLACE_ORDER_PARAMS, PLACE_ORDER_SQL, Placed, Placing,
    place_order_as_key_on, place_order_as_key_params, place_order_on,
};
use crate::outbox::Enqueuer;

/// One connection and its four statements.
pub(crate) struct ApiConnection {
    client: Client,
    lookup: Statement,
    touch: Statement,
    place: Statement,
    place_as_key: Statement,
}

impl OwnConnection for ApiConnection {
    fn client(&self) -> &Client {
        &self.client
    }
}

impl ApiConnection {
    async fn prepare(client: Client) -> Result<ApiConnection, DbError> {
        let as_key_params = place_order_as_key_params();
        let (lookup, touch, place, place_as_key) = tokio::try_join!(
            client.prepare_typed(AUTHENTICATE_SQL, AUTHENTICATE_PARAMS),
            client.prepare_typed(TOUCH_SQL, TOUCH_PARAMS),
            client.prepare_typed(PLACE_ORDER_SQL, PLACE_ORDER_PARAMS),
            client.prepare_typed(PLACE_ORDER_AS_KEY_SQL, &as_key_params),
        )?;
        Ok(ApiConnection {
            client,
            lookup,
            touch,
            place,
            place_as_key,
        })
    }

    /// [`crate::api_keys::authenticate`] on this connection.
    pub async fn authenticate(
        &self,
        key: &PresentedKey,
    ) -> Result<Option<Authenticated>, tokio_postgres::Error> {
        authenticate_on(&self.client, &self.lookup, &self.touch, key).await
    }

    /// [`crate::orders::place_order_on`] on this connection.
    pub async fn place(
        &self,
        enqueuer: &Enqueuer,
        placing: &Placing<'_>,
    ) -> Result<Option<Placed>, tokio_postgres::Error> {
        place_order_on(&self.client, &self.place, enqueuer, placing).await
    }

    /// [`Self::place`] for a key let in from the cache (`key_cache`): the
    /// statement checks the key's row too, and places nothing for a key
    /// that no longer holds the place scope.
    pub async fn place_as_key(
        &self,
        enqueuer: &Enqueuer,
        placing: &Placing<'_>,
    ) -> Result<KeyChecked, tokio_postgres::Error> {
        let granting = Scope::Place.granting();
        place_order_as_key_on(
            &self.client,
            &self.place_as_key,
            enqueuer,
            placing,
            &granting,
        )
        .await
    }
}

/// The API's connections: calls take them in turn.
#[derive(Debug)]
pub(crate) struct Direct {
    own: OwnConnections<ApiConnection>,
    next: AtomicUsize,
}

impl Direct {
    /// `connections` of them to `database_url`, the URL `pool` was built
    /// from; a statement not answered within `deadline` takes its
    /// connection for dead.
    pub fn new(
        pool: PgPool,
        database_url: String,
        connections: usize,
        deadline: Duration,
    ) -> Direct {
        Direct {
            own: OwnConnections::new(pool, database_url, connections, deadline, "the API's"),
            next: AtomicUsize::new(0),
        }
    }

    /// Runs `statement` on the next connection; `None` when none could be
    /// had (the caller runs it on the pool).
    pub async fn run<T>(
        &self,
        statement: impl AsyncFnOnce(&ApiConnection) -> Result<T, tokio_postgres::Error>,
    ) -> Option<Result<T, DbError>> {
        let slot = self.next.fetch_add(1, Ordering::Relaxed);
        self.own.run(slot, ApiConnection::prepare, statement).await
    }
}
