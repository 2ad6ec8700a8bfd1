//! What a webhook sends for an event: the Standard Webhooks envelope, with
//! the original `order.placed` body kept inside it.

use serde::Serialize;

use super::EVENT_ORDER_PLACED;
use crate::orders::{Order, OrderEvent, OrderId};

/// The body of one event, Standard Webhooks style:
/// `{"type":"order.paid","id":<event id>,"timestamp":"<RFC 3339>","data":{...}}`,
/// where `data` holds the event's own fields, its `seq` and the whole `order`.
/// An `order.placed` body also keeps the original `"event"` and `"order"`
/// fields, so receivers written for the first version read it unchanged. A
/// job enqueued before events existed has no event: it gets the original body.
pub(crate) fn event_body(order: &Order, event: Option<&OrderEvent>) -> serde_json::Result<Vec<u8>> {
    let legacy = serde_json::to_value(OrderPlaced::new(order))?;
    let Some(event) = event else {
        return serde_json::to_vec(&legacy);
    };
    let mut data = match &event.data {
        serde_json::Value::Object(fields) => fields.clone(),
        _ => serde_json::Map::new(),
    };
    data.insert("seq".into(), event.seq.into());
    data.insert("order".into(), legacy["order"].clone());
    let mut body = serde_json::Map::new();
    if event.event_type == EVENT_ORDER_PLACED {
        body.insert("event".into(), EVENT_ORDER_PLACED.into());
        body.insert("order".into(), legacy["order"].clone());
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
    serde_json::to_vec(&body)
}

/// The JSON body: `{"event":"order.placed","order":{...}}`.
#[derive(Debug, Serialize)]
struct OrderPlaced<'a> {
    event: &'static str,
    order: OrderBody<'a>,
}

#[derive(Debug, Serialize)]
struct OrderBody<'a> {
    id: OrderId,
    customer_email: &'a str,
    customer_name: &'a str,
    currency: &'a str,
    total_cents: i64,
    created_at: chrono::DateTime<chrono::Utc>,
    items: Vec<ItemBody<'a>>,
}

#[derive(Debug, Serialize)]
struct ItemBody<'a> {
    sku: &'a str,
    name: &'a str,
    quantity: i32,
    unit_price_cents: i64,
    line_total_cents: i64,
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
