//! What a webhook sends for an event: the Standard Webhooks envelope, with
//! the original `order.placed` body kept inside it.

use std::collections::BTreeMap;

use serde::Serialize;

use super::EVENT_ORDER_PLACED;
use crate::orders::{Order, OrderEvent, OrderId};

/// The body of one event, Standard Webhooks style:
/// `{"type":"order.paid","id":<event id>,"timestamp":"<RFC 3339>","data":{...}}`,
/// where `data` holds the event's own fields, its `seq` and the whole `order`.
/// An `order.placed` body also carries `"event": "order.placed"` and the
/// whole `"order"` at its top level, as the contract's `order.placed` body.
pub(crate) fn event_body(order: &Order, event: &OrderEvent) -> serde_json::Result<Vec<u8>> {
    let placed = OrderPlaced::new(order);
    // Written straight from the rows, in the order a `serde_json::Map`
    // (sorted keys) would write it: the bytes are the same as building the
    // body as a `Value` first, which cost a publish job more CPU than all
    // else it does (a tree of maps and strings made, copied and dropped).
    let mut data: BTreeMap<&str, Field<'_>> = match &event.data {
        serde_json::Value::Object(fields) => fields
            .iter()
            .map(|(name, value)| (name.as_str(), Field::Json(value)))
            .collect(),
        _ => BTreeMap::new(),
    };
    data.insert("seq", Field::Int(event.seq.into()));
    data.insert("order", Field::Order(&placed.order));
    let timestamp = event
        .created_at
        .to_rfc3339_opts(chrono::SecondsFormat::Micros, true);
    let mut body: BTreeMap<&str, Field<'_>> = BTreeMap::new();
    if event.event_type == EVENT_ORDER_PLACED {
        body.insert("event", Field::Str(EVENT_ORDER_PLACED));
        body.insert("order", Field::Order(&placed.order));
    }
    body.insert("type", Field::Str(&event.event_type));
    body.insert("id", Field::Int(event.id));
    body.insert("timestamp", Field::Str(&timestamp));
    body.insert("data", Field::Map(data));
    serde_json::to_vec(&body)
}

/// One value of a body's map.
enum Field<'a> {
    Json(&'a serde_json::Value),
    Int(i64),
    Str(&'a str),
    Order(&'a OrderBody<'a>),
    Map(BTreeMap<&'a str, Field<'a>>),
}

impl Serialize for Field<'_> {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        match self {
            Field::Json(value) => value.serialize(serializer),
            Field::Int(n) => serializer.serialize_i64(*n),
            Field::Str(s) => serializer.serialize_str(s),
            Field::Order(order) => order.serialize(serializer),
            Field::Map(map) => map.serialize(serializer),
        }
    }
}

/// The top-level fields of an `order.placed` body:
/// `{"event":"order.placed","order":{...}}`.
#[derive(Debug, Serialize)]
struct OrderPlaced<'a> {
    event: &'static str,
    order: OrderBody<'a>,
}

#[derive(Debug, Serialize)]
// Fields in name order, as a `serde_json::Map` writes them: bodies were
// first built as `Value`s, and receivers may have pinned those bytes.
struct OrderBody<'a> {
    created_at: chrono::DateTime<chrono::Utc>,
    currency: &'a str,
    customer_email: &'a str,
    customer_name: &'a str,
    id: OrderId,
    items: Vec<ItemBody<'a>>,
    total_cents: i64,
}

#[derive(Debug, Serialize)]
struct ItemBody<'a> {
    line_total_cents: i64,
    name: &'a str,
    quantity: i32,
    sku: &'a str,
    unit_price_cents: i64,
}

impl<'a> OrderPlaced<'a> {
    fn new(order: &'a Order) -> Self {
        OrderPlaced {
            event: EVENT_ORDER_PLACED,
            order: OrderBody {
                id: order.id,
                customer_email: &order.customer_email,
                customer_name: &order.customer_name,
                currency: order.currency.code(),
                total_cents: order.total_cents,
                created_at: order.created_at,
                items: order
                    .items
                    .iter()
                    .map(|item| ItemBody {
                        sku: &item.sku,
                        name: &item.name,
                        quantity: item.quantity,
                        unit_price_cents: item.unit_price_cents,
                        line_total_cents: item.line_total_cents(),
                    })
                    .collect(),
            },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::orders::{Currency, OrderItem, OrderStatus};

    /// The body as it was built before: a `Value`, then its bytes.
    fn through_value(order: &Order, event: &OrderEvent) -> Vec<u8> {
        let placed = serde_json::to_value(OrderPlaced::new(order)).expect("order");
        let mut data = match &event.data {
            serde_json::Value::Object(fields) => fields.clone(),
            _ => serde_json::Map::new(),
        };
        data.insert("seq".into(), event.seq.into());
        data.insert("order".into(), placed["order"].clone());
        let mut body = serde_json::Map::new();
        if event.event_type == EVENT_ORDER_PLACED {
            body.insert("event".into(), EVENT_ORDER_PLACED.into());
            body.insert("order".into(), placed["order"].clone());
        }
        body.insert("type".into(), event.event_type.clone().into());
        body.insert("id".into(), event.id.into());
        body.insert(
            "timestamp".into(),
            event
                .created_at
                .to_rfc3339_opts(chrono::SecondsFormat::Micros, true)
                .into(),
        );
        body.insert("data".into(), serde_json::Value::Object(data));
        serde_json::to_vec(&body).expect("body")
    }

    fn order() -> Order {
        let item = |id: i64, sku: &str, name: &str, quantity: i32, cents: i64| OrderItem {
            id,
            sku: sku.into(),
            name: name.into(),
            quantity,
            unit_price_cents: cents,
        };
        Order {
            id: OrderId::from(42),
            customer_email: "ada@example.com".into(),
            customer_name: "Ada \"Countess\" Lovelace \u{5b89}".into(),
            currency: Currency::parse("EUR").expect("EUR"),
            total_cents: 1650,
            status: OrderStatus::Paid,
            created_at: chrono::DateTime::from_timestamp(1_790_000_000, 123_456_000).expect("time"),
            expires_at: None,
            items: vec![
                item(1, "TEA-1", "Green tea", 2, 450),
                item(2, "CUP", "Cup", 1, 750),
            ],
        }
    }

    fn event(event_type: &str, data: serde_json::Value) -> OrderEvent {
        OrderEvent {
            id: 9001,
            order_id: OrderId::from(42),
            seq: 3,
            event_type: event_type.into(),
            data,
            created_at: chrono::DateTime::from_timestamp(1_790_000_100, 7_000).expect("time"),
        }
    }

    #[test]
    fn a_body_written_straight_from_the_rows_has_the_bytes_of_one_built_as_a_value() {
        let order = order();
        let cases = [
            event(EVENT_ORDER_PLACED, serde_json::json!({})),
            event("order.paid", serde_json::Value::Null),
            event(
                "order.shipped",
                serde_json::json!({"carrier": "DHL", "tracking": ["a", 1], "zeta": {"b": 1, "a": 2},
                                   "seq": 99, "order": "shadowed"}),
            ),
        ];
        for event in &cases {
            let straight = event_body(&order, event).expect("body");
            assert_eq!(
                String::from_utf8_lossy(&straight),
                String::from_utf8_lossy(&through_value(&order, event)),
                "{}",
                event.event_type
            );
        }
    }
}
