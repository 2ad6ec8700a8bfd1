//! `POST /orders` lets a key in from the API's cache of keys, and the
//! placement's own statement reads the key's row: a key revoked, expired or
//! stripped of its scope after it was cached places nothing, and the answer
//! is the key's refusal, whatever else is wrong with the request.

use diesel::prelude::*;
use order_service::api_keys::Scope;
use order_service::schema::api_keys;
use reqwest::StatusCode;
use serde_json::{Value, json};

use crate::api_keys::{forbidden, post, unauthorized};
use crate::support::app::{create_api_key, http_client_with_key, spawn_app};
use crate::support::order_json;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_key_let_in_from_the_cache_is_checked_by_the_placement() {
    let app = spawn_app().await;
    let orders = app.url("/orders");
    let client = |name: &str, scopes: &[Scope]| {
        http_client_with_key(&create_api_key(&app.db.url, name, scopes))
    };
    let revoked = client("revoked", &[Scope::Place]);
    let expired = client("expired", &[Scope::Place]);
    let narrowed = client("narrowed", &[Scope::Place, Scope::Read]);
    let kept = client("kept", &[Scope::Place]);
    let keyed = async |shop: &reqwest::Client| {
        shop.post(orders.clone())
            .header("Idempotency-Key", "first")
            .json(&order_json("Ada"))
            .send()
            .await
            .expect("POST")
    };
    // One placement each, so that each key is in the cache.
    let mut first: Option<Value> = None;
    for shop in [&revoked, &expired, &narrowed, &kept] {
        let placed = keyed(shop).await;
        assert_eq!(placed.status(), StatusCode::CREATED);
        first = Some(placed.json().await.expect("JSON"));
    }

    // By hand, as an operator's SQL would do it: nothing tells the cache.
    // `kept`'s last use is cleared too: only a look-up at the door moves it
    // (it was just moved, so it is a minute from due), and a key let in
    // from the cache is not looked up there.
    let mut conn = app.db.conn();
    for change in [
        "UPDATE api_keys SET revoked_at = now() WHERE name = 'revoked'",
        "UPDATE api_keys SET expires_at = now() - interval '1 second' WHERE name = 'expired'",
        "UPDATE api_keys SET scopes = '{orders:read}' WHERE name = 'narrowed'",
        "UPDATE api_keys SET last_used_at = NULL WHERE name = 'kept'",
    ] {
        diesel::sql_query(change).execute(&mut conn).expect(change);
    }
    let before = app.rows();

    // A body that is wrong: the key's refusal, not the body's 422.
    let bad = json!({"customer_email": "not an address", "items": []});
    let message = unauthorized(post(&revoked, orders.clone(), &bad).await).await;
    assert!(message.contains("revoked"), "{message}");
    // A good body: the placement's statement refuses the key.
    let message = unauthorized(post(&expired, orders.clone(), &order_json("Ada")).await).await;
    assert!(message.contains("expired"), "{message}");
    forbidden(
        post(&narrowed, orders.clone(), &order_json("Ada")).await,
        Scope::Place,
    )
    .await;
    // Refused once, refused again.
    for shop in [&revoked, &expired] {
        unauthorized(post(shop, orders.clone(), &order_json("Ada")).await).await;
    }
    assert_eq!(app.rows(), before, "nothing written for a refused key");

    // The key left alone still places, and its repeat finds its order.
    let repeat = keyed(&kept).await;
    assert_eq!(repeat.status(), StatusCode::OK);
    let repeat: Value = repeat.json().await.expect("JSON");
    assert_eq!(Some(&repeat["id"]), first.as_ref().map(|f| &f["id"]));
    let placed = post(&kept, orders.clone(), &order_json("Ada")).await;
    assert_eq!(placed.status(), StatusCode::CREATED);
    // Both came in from the cache: the door read no row of the key, so its
    // last use is as the UPDATE left it.
    let last_used: Option<chrono::DateTime<chrono::Utc>> = api_keys::table
        .filter(api_keys::name.eq("kept"))
        .select(api_keys::last_used_at)
        .first(&mut conn)
        .expect("the kept key");
    assert_eq!(last_used, None, "a cached key was looked up at the door");
    app.stop().await;
}
