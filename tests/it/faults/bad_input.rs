//! Bad input, tried systematically: property tests over order parsing and over
//! the API's body, and hostile values followed from the API to the mail.

use std::time::Duration;

use order_service::orders::{MAX_ITEMS, MAX_QUANTITY, MAX_UNIT_PRICE, NewOrder};
use proptest::prelude::*;
use proptest::test_runner::{Config, TestCaseError, TestRunner};
use reqwest::StatusCode;
use serde_json::{Map, Value, json};

use super::{Sinks, wait_all_terminal};
use crate::support::app::{Rows, TestApp, spawn_app};
use crate::support::http::Answer;
use crate::support::process::BinProcess;

// ---------------------------------------------------------------- strategies

/// Text meant to break things: any Unicode, control characters and NUL, RTL
/// overrides, combining marks, emoji, SQL, HTML, header injection, lengths
/// around the limits and far past them.
fn hostile_text() -> BoxedStrategy<String> {
    prop_oneof![
        4 => "\\PC{0,16}",
        2 => ".{0,16}",
        1 => Just(String::new()),
        1 => Just("   ".to_owned()),
        1 => Just("\u{202E}gnp.exe\u{202C} \u{200F}שלום עולם\u{200E}".to_owned()),
        1 => Just("e\u{301}\u{301}\u{301}Z\u{336}\u{336}\u{489}".to_owned()),
        1 => Just("👩‍👩‍👧‍👦 🎉 🇺🇳 \u{FE0F}\u{200D}".to_owned()),
        1 => Just("a\u{0}b".to_owned()),
        1 => Just("Eve\r\nBcc: victim@evil.example".to_owned()),
        1 => Just("Robert'); DROP TABLE orders;--".to_owned()),
        1 => Just("<script>alert(1)</script>".to_owned()),
        1 => (190_usize..210).prop_map(|n| "é".repeat(n)),
        1 => (1_usize..20_000).prop_map(|n| "x".repeat(n)),
    ]
    .boxed()
}

fn number() -> BoxedStrategy<Value> {
    prop_oneof![
        4 => (-3_i64..12_000).prop_map(Value::from),
        1 => any::<i64>().prop_map(Value::from),
        1 => any::<u64>().prop_map(Value::from),
        1 => prop::sample::select(vec![
            0,
            -1,
            i64::MAX,
            i64::MIN,
            MAX_QUANTITY,
            MAX_QUANTITY + 1,
            MAX_UNIT_PRICE,
            MAX_UNIT_PRICE + 1,
        ])
        .prop_map(Value::from),
        1 => prop::sample::select(vec![1.5_f64, -0.0, 2.0, 1e19, 1e300]).prop_map(|f| json!(f)),
        1 => Just(json!("2")),
        1 => Just(Value::Null),
    ]
    .boxed()
}

fn email() -> BoxedStrategy<Value> {
    prop_oneof![
        6 => Just(json!("ada@example.com")),
        2 => "[a-z0-9.+]{1,12}@[a-z]{1,10}\\.[a-z]{2,4}".prop_map(Value::from),
        2 => hostile_text().prop_map(Value::from),
        1 => prop::sample::select(vec![
            "ada@example.com\r\nBcc: victim@evil.example",
            "a\u{0}@example.com",
            "ü@exämple.com",
            "\"quoted local\"@example.com",
            " ada@example.com ",
            "<ada@example.com>",
            "Ada <ada@example.com>",
        ])
        .prop_map(Value::from),
        1 => Just(Value::from(format!("{}@example.com", "a".repeat(300)))),
        1 => number(),
    ]
    .boxed()
}

fn text(valid: &'static str) -> BoxedStrategy<Value> {
    prop_oneof![
        6 => Just(Value::from(valid)),
        2 => hostile_text().prop_map(Value::from),
        1 => number(),
    ]
    .boxed()
}

fn currency() -> BoxedStrategy<Value> {
    prop_oneof![
        8 => prop::sample::select(vec!["EUR", "USD", "JPY", "KWD"]).prop_map(Value::from),
        1 => prop::sample::select(vec!["eur", "XXX", "", "EURO", "€"]).prop_map(Value::from),
        1 => hostile_text().prop_map(Value::from),
        1 => number(),
    ]
    .boxed()
}

fn item() -> BoxedStrategy<Value> {
    (
        text("TEA-1"),
        text("Green tea"),
        prop_oneof![6 => (1_i64..20).prop_map(Value::from), 2 => number()],
        prop_oneof![6 => (0_i64..100_000).prop_map(Value::from), 2 => number()],
        prop::option::weighted(0.05, "[a-z_]{1,12}"),
        prop::option::weighted(0.05, 0_usize..4),
    )
        .prop_map(|(sku, name, quantity, price, extra, missing)| {
            let mut item = Map::new();
            item.insert("sku".into(), sku);
            item.insert("name".into(), name);
            item.insert("quantity".into(), quantity);
            item.insert("unit_price_cents".into(), price);
            if let Some(extra) = extra {
                item.insert(extra, json!(1));
            }
            if let Some(missing) = missing {
                let key = ["sku", "name", "quantity", "unit_price_cents"][missing];
                item.remove(key);
            }
            Value::Object(item)
        })
        .boxed()
}

/// The largest order the limits allow: every line at the largest quantity and
/// unit price, as many lines as allowed (or one too many).
fn largest_items(lines: usize) -> Value {
    let line = json!({
        "sku": "MAX",
        "name": "Most expensive",
        "quantity": MAX_QUANTITY,
        "unit_price_cents": MAX_UNIT_PRICE
    });
    Value::Array(vec![line; lines])
}

/// Mostly well-formed orders with some fields made hostile.
fn near_valid_order() -> BoxedStrategy<Value> {
    (
        email(),
        text("Ada Lovelace"),
        currency(),
        prop_oneof![
            8 => prop::collection::vec(item(), 1..4).prop_map(Value::Array),
            1 => Just(json!([])),
            1 => prop::sample::select(vec![MAX_ITEMS, MAX_ITEMS + 1]).prop_map(largest_items),
            1 => number(),
        ],
        prop::option::weighted(0.05, "[a-z_]{1,12}"),
        prop::option::weighted(0.05, 0_usize..4),
    )
        .prop_map(|(email, name, currency, items, extra, missing)| {
            let mut order = Map::new();
            order.insert("customer_email".into(), email);
            order.insert("customer_name".into(), name);
            order.insert("currency".into(), currency);
            order.insert("items".into(), items);
            if let Some(extra) = extra {
                order.insert(extra, json!("surprise"));
            }
            if let Some(missing) = missing {
                let key = ["customer_email", "customer_name", "currency", "items"][missing];
                order.remove(key);
            }
            Value::Object(order)
        })
        .boxed()
}

/// Any JSON at all, with the contract's field names over-represented.
fn any_json() -> BoxedStrategy<Value> {
    let leaf = prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::Bool),
        number(),
        hostile_text().prop_map(Value::from),
    ];
    let key = prop_oneof![
        prop::sample::select(vec![
            "customer_email",
            "customer_name",
            "currency",
            "items",
            "sku",
            "name",
            "quantity",
            "unit_price_cents",
        ])
        .prop_map(str::to_owned),
        "\\PC{0,8}",
    ];
    leaf.prop_recursive(3, 24, 5, move |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..5).prop_map(Value::Array),
            prop::collection::btree_map(key.clone(), inner, 0..5)
                .prop_map(|m| Value::Object(m.into_iter().collect())),
        ]
    })
    .boxed()
}

/// A field path as the parser names them: `customer_email`, `items`,
/// `items[3]`, `items[3].quantity`, or unknown field names the body carried.
fn is_a_field_path(field: &str, body: &Value) -> bool {
    let top = ["customer_email", "customer_name", "currency", "items"];
    let item = ["sku", "name", "quantity", "unit_price_cents"];
    if field.is_empty() || top.contains(&field) {
        return true;
    }
    if let Some(object) = body.as_object()
        && object.contains_key(field)
    {
        return true; // an unknown top-level field, named as sent
    }
    let Some(rest) = field.strip_prefix("items[") else {
        return false;
    };
    let Some((index, rest)) = rest.split_once(']') else {
        return false;
    };
    let Ok(index) = index.parse::<usize>() else {
        return false;
    };
    let Some(line) = body["items"].get(index) else {
        return false;
    };
    match rest.strip_prefix('.') {
        None => rest.is_empty(),
        Some(name) => item.contains(&name) || line.get(name).is_some(),
    }
}

// ------------------------------------------------------------------- parsing

/// What an accepted order must satisfy, whatever the input was.
fn check_accepted(order: &NewOrder, body: &Value) -> Result<(), TestCaseError> {
    prop_assert!((1..=MAX_ITEMS).contains(&order.items().len()));
    let mut total: i64 = 0;
    for item in order.items() {
        prop_assert!((1..=MAX_QUANTITY).contains(&i64::from(item.quantity.get())));
        prop_assert!((0..=MAX_UNIT_PRICE).contains(&item.unit_price.cents()));
        for text in [item.sku.as_str(), item.name.as_str()] {
            prop_assert!(!text.is_empty() && text.trim() == text);
            prop_assert!(!text.chars().any(char::is_control), "{text:?}");
            prop_assert!(
                !text
                    .chars()
                    .any(order_service::text::is_invisible_format_control),
                "{text:?}"
            );
        }
        total = total
            .checked_add(item.line_total().cents())
            .ok_or_else(|| TestCaseError::fail("total overflows"))?;
    }
    prop_assert_eq!(order.total().cents(), total);
    let name = order.customer_name.as_str();
    prop_assert!(!name.is_empty() && !name.chars().any(char::is_control));
    prop_assert!(
        !name
            .chars()
            .any(order_service::text::is_invisible_format_control)
    );
    prop_assert!(!order.customer_email.as_str().contains(['\r', '\n', '\0']));

    // Parsing what was accepted again gives the same order.
    let again = json!({
        "customer_email": order.customer_email.as_str(),
        "customer_name": order.customer_name.as_str(),
        "currency": order.currency.code(),
        "items": order.items().iter().map(|i| json!({
            "sku": i.sku.as_str(),
            "name": i.name.as_str(),
            "quantity": i.quantity.get(),
            "unit_price_cents": i.unit_price.cents(),
        })).collect::<Vec<_>>(),
    });
    let reparsed = NewOrder::parse(&again);
    prop_assert_eq!(reparsed.as_ref(), Ok(order), "{}", body);
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig {
        cases: 512,
        failure_persistence: None,
        ..ProptestConfig::default()
    })]

    #[test]
    fn order_parsing_accepts_only_orders_within_the_limits_and_names_the_field_of_every_rejection(
        body in prop_oneof![3 => near_valid_order(), 1 => any_json()]
    ) {
        match NewOrder::parse(&body) {
            Ok(order) => check_accepted(&order, &body)?,
            Err(error) => {
                prop_assert!(!error.message.is_empty());
                prop_assert!(is_a_field_path(&error.field, &body), "field {:?} of {}", error.field, body);
            }
        }
    }
}

// ----------------------------------------------------------------------- API

#[derive(Debug, Clone)]
enum Body {
    Json(Value),
    Raw(Vec<u8>),
}

/// A valid order whose free text is any Unicode but control characters (RTL
/// overrides, combining marks, emoji, SQL and HTML characters): it must be
/// stored and shown as sent.
fn valid_order_with_wild_text() -> BoxedStrategy<Value> {
    // Anything but control, unassigned and private-use characters, and the
    // invisible format controls the API refuses (`is_invisible_format_control`:
    // bidi overrides, zero-width spaces, U+FEFF), which proptest draws so often
    // that a valid order came out in 2 to 8 of 96 cases, and in none in one
    // run of the suite: their refusal is checked with fixed strings (`api.rs`, the
    // hostile values above). The format characters the API keeps (joiners,
    // soft hyphens, Arabic number signs) stay in.
    const REFUSED: &str = "\\x{061C}\\x{180E}\\x{200B}\\x{200E}\\x{200F}\\x{202A}-\\x{202E}\\x{2060}-\\x{2064}\\x{2066}-\\x{2069}\\x{FEFF}\\x{FFF9}-\\x{FFFB}";
    let wild = format!(
        "[^\\p{{Cc}}\\p{{Cn}}\\p{{Co}}\\s{REFUSED}][^\\p{{Cc}}\\p{{Cn}}\\p{{Co}}{REFUSED}]{{0,40}}"
    );
    let wild = || proptest::string::string_regex(&wild).expect("a valid pattern");
    (
        wild(),
        wild(),
        wild(),
        1_i64..=MAX_QUANTITY,
        0_i64..=MAX_UNIT_PRICE,
    )
        .prop_map(|(name, sku, item, quantity, price)| {
            json!({
                "customer_email": "ada@example.com",
                "customer_name": name,
                "currency": "EUR",
                "items": [{"sku": sku.chars().take(64).collect::<String>(), "name": item,
                           "quantity": quantity, "unit_price_cents": price}],
            })
        })
        .boxed()
}

fn api_body() -> BoxedStrategy<Body> {
    prop_oneof![
        3 => valid_order_with_wild_text().prop_map(Body::Json),
        6 => near_valid_order().prop_map(Body::Json),
        2 => any_json().prop_map(Body::Json),
        1 => prop::collection::vec(any::<u8>(), 0..64).prop_map(Body::Raw),
        1 => (near_valid_order(), 0.0..1.0_f64).prop_map(|(order, cut)| {
            let bytes = serde_json::to_vec(&order).unwrap_or_default();
            let keep = (bytes.len() as f64 * cut) as usize;
            Body::Raw(bytes[..keep].to_vec())
        }),
        1 => prop::sample::select(vec![
            br#"{"customer_name":"\ud800"}"#.to_vec(),
            b"\xff\xfe{}".to_vec(),
            br#"{"items":[1e999999]}"#.to_vec(),
            b"[".repeat(10_000),
        ])
        .prop_map(Body::Raw),
    ]
    .boxed()
}

async fn check_answer(app: &TestApp, body: Body) -> Result<StatusCode, TestCaseError> {
    let before = app.rows();
    let bytes = match &body {
        Body::Json(value) => serde_json::to_vec(value).expect("serialize"),
        Body::Raw(bytes) => bytes.clone(),
    };
    let response = app.post_raw(Some("application/json"), bytes, None).await;
    let status = response.status();
    let answer: Value = response
        .json()
        .await
        .map_err(|e| TestCaseError::fail(format!("{status}: not JSON: {e}")))?;
    let after = app.rows();
    prop_assert!(!status.is_server_error(), "{status} {answer} for {body:?}");

    let parsed = match &body {
        Body::Json(value) => Some(NewOrder::parse(value)),
        Body::Raw(bytes) => serde_json::from_slice::<Value>(bytes)
            .ok()
            .map(|v| NewOrder::parse(&v)),
    };
    if status == StatusCode::CREATED {
        let Some(Ok(order)) = parsed else {
            return Err(TestCaseError::fail(format!(
                "201 for a body the parser refuses: {body:?}"
            )));
        };
        // Written whole: the order, its items, its three jobs.
        prop_assert_eq!(
            after,
            Rows {
                orders: before.orders + 1,
                items: before.items + order.items().len() as i64,
                jobs: before.jobs + 3,
            }
        );
        // Stored and shown literally.
        prop_assert_eq!(&answer["customer_name"], order.customer_name.as_str());
        prop_assert_eq!(answer["total_cents"].as_i64(), Some(order.total().cents()));
        for (shown, sent) in answer["items"]
            .as_array()
            .map(Vec::as_slice)
            .unwrap_or_default()
            .iter()
            .zip(order.items())
        {
            prop_assert_eq!(&shown["name"], sent.name.as_str());
            prop_assert_eq!(&shown["sku"], sent.sku.as_str());
        }
    } else {
        prop_assert!(status.is_client_error(), "{status}");
        prop_assert_eq!(after, before, "a rejected body wrote nothing");
        let error = &answer["error"];
        prop_assert!(
            error["code"].is_string() && error["message"].is_string(),
            "{answer}"
        );
        prop_assert_eq!(answer.as_object().map(Map::len), Some(1), "{}", answer);
        if status == StatusCode::UNPROCESSABLE_ENTITY {
            let Some(Err(refused)) = parsed else {
                return Err(TestCaseError::fail(format!(
                    "422 for a body the parser accepts: {body:?}"
                )));
            };
            prop_assert_eq!(error["field"].as_str(), Some(refused.field.as_str()));
        }
    }
    Ok(status)
}

#[test]
fn the_order_api_answers_any_body_with_an_order_or_a_json_4xx_never_a_500_nor_a_partial_write() {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime");
    let app = runtime.block_on(spawn_app());
    let mut runner = TestRunner::new(Config {
        cases: 96,
        failure_persistence: None,
        ..Config::default()
    });
    let statuses = std::sync::Mutex::new(std::collections::BTreeMap::<u16, usize>::new());
    let result = runner.run(&api_body(), |body| {
        let status = runtime.block_on(check_answer(&app, body))?;
        *statuses
            .lock()
            .expect("counts")
            .entry(status.as_u16())
            .or_default() += 1;
        Ok(())
    });
    if let Err(failure) = result {
        panic!("{failure}");
    }
    let statuses = statuses.into_inner().expect("counts");
    eprintln!("answers by status over 96 random bodies: {statuses:?}");
    assert!(
        statuses.contains_key(&201) && statuses.contains_key(&422) && statuses.contains_key(&400),
        "the bodies reach every branch: {statuses:?}"
    );
    runtime.block_on(app.stop());
}

// ------------------------------------------------------------ hostile values

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hostile_values_are_stored_and_shown_literally_escaped_in_html_and_add_no_smtp_headers() {
    let app = spawn_app().await;
    let sql = "Robert'); DROP TABLE orders;--";
    let html = "<script>alert('x')</script> & \"quoted\" <b>bold</b>";
    let display = "=?utf-8?b?QmNjOiB2aWN0aW1AZXZpbC5leGFtcGxl?= Mallory <mallory@evil.example>, eve@evil.example";
    let bodies = [
        json!({"customer_email": "ada@example.com", "customer_name": "Plain Customer",
               "currency": "EUR", "items": [{"sku": "TEA-1", "name": "Tea", "quantity": 1, "unit_price_cents": 100}]}),
        json!({"customer_email": "ada+tag@example.com", "customer_name": sql,
               "currency": "EUR", "items": [{"sku": "' OR '1'='1", "name": html, "quantity": 1, "unit_price_cents": 100}]}),
        json!({"customer_email": "bob@example.com", "customer_name": display,
               "currency": "EUR", "items": [{"sku": "%0d%0aBcc:x", "name": "gnp.exe 👩‍💻 e\u{301}", "quantity": 1, "unit_price_cents": 100}]}),
    ];
    let mut ids = Vec::new();
    for body in &bodies {
        let response = app.post_order(body, None).await;
        assert_eq!(response.status(), StatusCode::CREATED);
        let shown: Value = response.json().await.expect("JSON");
        assert_eq!(shown["customer_name"], body["customer_name"]);
        assert_eq!(shown["items"][0]["name"], body["items"][0]["name"]);
        assert_eq!(shown["items"][0]["sku"], body["items"][0]["sku"]);
        ids.push(shown["id"].as_i64().expect("id"));
    }
    // Line breaks in any header-bound field are refused, and write nothing.
    let rows = app.rows();
    for (pointer, value) in [
        ("/customer_name", "Eve\r\nBcc: victim@evil.example"),
        ("/customer_name", "Eve\nBcc: victim@evil.example"),
        (
            "/customer_email",
            "ada@example.com\r\nBcc: victim@evil.example",
        ),
        ("/customer_email", "ada@example.com\nX-Injected: 1"),
        ("/items/0/name", "Tea\rX-Injected: 1"),
        // A right-to-left override makes "gnp.exe" read as "exe.png".
        ("/items/0/name", "\u{202E}gnp.exe"),
    ] {
        let mut body = bodies[0].clone();
        *body.pointer_mut(pointer).expect(pointer) = json!(value);
        let response = app.post_order(&body, None).await;
        assert_eq!(
            response.status(),
            StatusCode::UNPROCESSABLE_ENTITY,
            "{value:?}"
        );
    }
    assert_eq!(app.rows(), rows);
    // Shown literally by GET too.
    let shown: Value = app
        .get(&format!("/orders/{}", ids[1]))
        .await
        .json()
        .await
        .expect("JSON");
    assert_eq!(shown["customer_name"], sql);
    assert_eq!(shown["items"][0]["sku"], "' OR '1'='1");

    // The mails, sent by the relay binary.
    let sinks = Sinks::start([], Answer::status(200)).await;
    let (mut relay, _) = BinProcess::start_relay(sinks.relay("hostile", &app.db.url)).await;
    let mut conn = app.db.conn();
    wait_all_terminal(&mut conn, Duration::from_secs(60)).await;
    relay.terminate().await;
    let summary = sinks.check(&mut conn);
    assert_eq!((summary.done, summary.failed), (9, 0));

    let mails = sinks.smtp.accepted();
    let mail_of = |id: i64| {
        mails
            .iter()
            .find(|m| {
                m.header("subject")
                    .is_some_and(|s| s.contains(&format!("#{id} ")))
            })
            .unwrap_or_else(|| panic!("no mail for order {id}"))
    };
    let header_names = |mail: &crate::support::smtp::Mail| {
        let mut names: Vec<String> = mail
            .headers()
            .into_iter()
            .map(|(n, _)| n.to_ascii_lowercase())
            .collect();
        names.sort();
        names
    };
    let plain = mail_of(ids[0]);
    for (id, recipient) in [(ids[1], "ada+tag@example.com"), (ids[2], "bob@example.com")] {
        let mail = mail_of(id);
        assert_eq!(header_names(mail), header_names(plain), "no header added");
        assert_eq!(
            mail.rcpt_to,
            vec![format!("TO:<{recipient}>")],
            "one recipient"
        );
        let head = mail.data.split("\r\n\r\n").next().unwrap_or_default();
        assert!(!head.contains("victim@evil.example"), "{head}");
    }
    let hostile = mail_of(ids[1]);
    let html_part = hostile.part("text/html").expect("HTML part");
    assert!(
        !html_part.contains("<script>") && !html_part.contains("<b>bold"),
        "{html_part}"
    );
    assert!(html_part.contains("&lt;script&gt;"), "{html_part}");
    assert!(
        html_part.contains("Robert&#x27;); DROP TABLE orders;--"),
        "{html_part}"
    );
    let text_part = hostile.part("text/plain").expect("text part");
    assert!(
        text_part.contains(html) && text_part.contains(sql),
        "{text_part}"
    );
    assert_eq!(app.rows().orders, 3, "the orders table is still there");
    app.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_largest_order_the_limits_allow_goes_through_every_effect_and_one_line_more_is_refused()
{
    let app = spawn_app().await;
    let mut body = json!({
        "customer_email": "ada@example.com",
        "customer_name": "Big Spender",
        "currency": "KWD",
        "items": largest_items(MAX_ITEMS),
    });
    let response = app.post_order(&body, None).await;
    assert_eq!(response.status(), StatusCode::CREATED);
    let order: Value = response.json().await.expect("JSON");
    let total = i64::try_from(MAX_ITEMS).expect("small") * MAX_QUANTITY * MAX_UNIT_PRICE;
    assert_eq!(order["total_cents"].as_i64(), Some(total));

    body["items"] = largest_items(MAX_ITEMS + 1);
    let rows = app.rows();
    let refused = app.post_order(&body, None).await;
    assert_eq!(refused.status(), StatusCode::UNPROCESSABLE_ENTITY);
    assert_eq!(app.rows(), rows);

    let sinks = Sinks::start([], Answer::status(200)).await;
    let (mut relay, _) = BinProcess::start_relay(sinks.relay("largest", &app.db.url)).await;
    let mut conn = app.db.conn();
    wait_all_terminal(&mut conn, Duration::from_secs(60)).await;
    relay.terminate().await;
    let summary = sinks.check(&mut conn);
    assert_eq!((summary.done, summary.failed), (3, 0));
    let hook = sinks.http.requests()[0].json();
    assert_eq!(hook["order"]["total_cents"].as_i64(), Some(total));
    let receipt = app
        .get(&format!("/orders/{}/receipt.pdf", order["id"]))
        .await;
    assert_eq!(receipt.status(), StatusCode::OK);
    app.stop().await;
}
