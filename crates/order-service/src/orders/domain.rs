//! `NewOrder` and its parts, parsed from raw JSON at the edge so that an invalid
//! order cannot exist past it. Every rejection names the field as a path
//! (`items[0].quantity`), which the API returns as is.

use std::fmt;

use serde::Deserialize;
use serde_json::Value;

use super::currency::Currency;
use super::json::{Object, from_json, required};
use super::validation::ValidationError;

/// Most items one order may carry; a larger order is almost certainly a bug or abuse.
pub const MAX_ITEMS: usize = 100;
/// Largest quantity of one line.
pub const MAX_QUANTITY: i64 = 10_000;
/// Largest unit price, in minor units (ten billion of the major unit at two decimals).
pub const MAX_UNIT_PRICE: i64 = 1_000_000_000_000;
const MAX_NAME_CHARS: usize = 200;
const MAX_SKU_CHARS: usize = 64;
const MAX_EMAIL_CHARS: usize = 254;

/// A syntactically valid mailbox address (no display name), as lettre will send it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CustomerEmail(String);

impl CustomerEmail {
    pub fn parse(raw: &str) -> Result<Self, String> {
        let trimmed = raw.trim();
        if trimmed.is_empty() {
            return Err("must not be empty".into());
        }
        if trimmed.chars().count() > MAX_EMAIL_CHARS {
            return Err(format!("must be at most {MAX_EMAIL_CHARS} characters"));
        }
        if let Some(c) = trimmed
            .chars()
            .find(|c| crate::text::is_invisible_format_control(*c))
        {
            return Err(format!(
                "must not contain invisible format characters (found {})",
                c.escape_unicode()
            ));
        }
        trimmed
            .parse::<lettre::Address>()
            .map_err(|e| format!("is not an email address ({e})"))?;
        Ok(CustomerEmail(trimmed.to_owned()))
    }
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

/// Free text shown to people (a customer's or a product's name): non-empty after
/// trimming, bounded, and free of control characters, so it cannot break a mail
/// header or a PDF line.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DisplayText(String);

impl DisplayText {
    pub fn parse(raw: &str, max_chars: usize) -> Result<Self, String> {
        let trimmed = raw.trim();
        if trimmed.is_empty() {
            return Err("must not be empty".into());
        }
        if trimmed.chars().count() > max_chars {
            return Err(format!("must be at most {max_chars} characters"));
        }
        if trimmed.chars().any(char::is_control) {
            return Err("must not contain control characters".into());
        }
        if let Some(c) = trimmed
            .chars()
            .find(|c| crate::text::is_invisible_format_control(*c))
        {
            return Err(format!(
                "must not contain invisible format characters (found {})",
                c.escape_unicode()
            ));
        }
        Ok(DisplayText(trimmed.to_owned()))
    }
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for DisplayText {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// A quantity between 1 and [`MAX_QUANTITY`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Quantity(i32);

impl Quantity {
    pub fn get(self) -> i32 {
        self.0
    }
}

/// A non-negative amount in the currency's minor units.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub struct Money(i64);

impl Money {
    pub fn cents(self) -> i64 {
        self.0
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NewOrderItem {
    pub sku: DisplayText,
    pub name: DisplayText,
    pub quantity: Quantity,
    pub unit_price: Money,
}

impl NewOrderItem {
    /// quantity × unit price; bounded by the limits above, so it cannot overflow.
    pub fn line_total(&self) -> Money {
        Money(i64::from(self.quantity.0) * self.unit_price.0)
    }
}

/// An order that passed validation: only [`NewOrder::parse`] makes one.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NewOrder {
    pub customer_email: CustomerEmail,
    pub customer_name: DisplayText,
    pub currency: Currency,
    // Private, with the total cached beside it: a caller that could push a
    // line would break "total = sum of the lines".
    items: Vec<NewOrderItem>,
    total: Money,
}

/// The body of `POST /orders` as it arrives. Every field is an `Option` so that
/// a missing one is "is required" on its own path; unknown fields are refused
/// so that a typo (`quantiy`) is an error instead of a silently dropped value.
/// Its schema (`/openapi.json`) states the rules [`NewOrder::parse`] holds it to.
#[derive(Debug, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
#[schema(as = NewOrder)]
pub(crate) struct OrderBody {
    #[schema(required = true, nullable = false, format = Email, max_length = 254, example = "ada@example.com")]
    customer_email: Option<String>,
    #[schema(
        required = true,
        nullable = false,
        min_length = 1,
        max_length = 200,
        example = "Ada Lovelace"
    )]
    customer_name: Option<String>,
    #[schema(
        required = true,
        nullable = false,
        pattern = "^[A-Z]{3}$",
        example = "EUR"
    )]
    currency: Option<String>,
    #[schema(required = true, nullable = false, value_type = Vec<ItemBody>, min_items = 1, max_items = 100)]
    items: Option<Vec<Object<ItemBody>>>,
}

/// One line of [`OrderBody`].
#[derive(Debug, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
#[schema(as = NewOrderItem)]
pub(crate) struct ItemBody {
    #[schema(
        required = true,
        nullable = false,
        min_length = 1,
        max_length = 64,
        example = "TEA-1"
    )]
    sku: Option<String>,
    #[schema(
        required = true,
        nullable = false,
        min_length = 1,
        max_length = 200,
        example = "Green tea"
    )]
    name: Option<String>,
    #[schema(required = true, nullable = false, minimum = 1, maximum = 10000)]
    quantity: Option<i64>,
    #[schema(
        required = true,
        nullable = false,
        minimum = 0,
        maximum = 1_000_000_000_000_i64
    )]
    unit_price_cents: Option<i64>,
}

impl NewOrder {
    /// Parses the JSON body of `POST /orders`.
    pub fn parse(body: &Value) -> Result<NewOrder, ValidationError> {
        let body: OrderBody = from_json(body)?;

        let customer_email =
            CustomerEmail::parse(&required(body.customer_email, "customer_email")?)
                .map_err(|m| ValidationError::new("customer_email", m))?;
        let customer_name = DisplayText::parse(
            &required(body.customer_name, "customer_name")?,
            MAX_NAME_CHARS,
        )
        .map_err(|m| ValidationError::new("customer_name", m))?;
        let currency_raw = required(body.currency, "currency")?;
        let currency = Currency::parse(&currency_raw).ok_or_else(|| {
            ValidationError::new(
                "currency",
                format!("{currency_raw:?} is not an upper-case ISO 4217 currency code"),
            )
        })?;

        let items_raw = required(body.items, "items")?;
        if items_raw.is_empty() {
            return Err(ValidationError::new("items", "must hold at least one item"));
        }
        if items_raw.len() > MAX_ITEMS {
            return Err(ValidationError::new(
                "items",
                format!("must hold at most {MAX_ITEMS} items"),
            ));
        }
        let items = items_raw
            .into_iter()
            .enumerate()
            .map(|(i, Object(raw))| parse_item(raw, &format!("items[{i}]")))
            .collect::<Result<Vec<_>, _>>()?;

        let total = items
            .iter()
            .try_fold(0_i64, |sum, item| sum.checked_add(item.line_total().0))
            .ok_or_else(|| ValidationError::new("items", "the order total is too large"))?;

        Ok(NewOrder {
            customer_email,
            customer_name,
            currency,
            items,
            total: Money(total),
        })
    }

    /// The order's lines, as parsed.
    pub fn items(&self) -> &[NewOrderItem] {
        &self.items
    }

    pub fn total(&self) -> Money {
        self.total
    }
}

fn parse_item(raw: ItemBody, path: &str) -> Result<NewOrderItem, ValidationError> {
    let field = |name: &str| format!("{path}.{name}");

    let sku = DisplayText::parse(&required(raw.sku, field("sku"))?, MAX_SKU_CHARS)
        .map_err(|m| ValidationError::new(field("sku"), m))?;
    let name = DisplayText::parse(&required(raw.name, field("name"))?, MAX_NAME_CHARS)
        .map_err(|m| ValidationError::new(field("name"), m))?;
    let quantity = required(raw.quantity, field("quantity"))?;
    if !(1..=MAX_QUANTITY).contains(&quantity) {
        return Err(ValidationError::new(
            field("quantity"),
            format!("must be between 1 and {MAX_QUANTITY}, got {quantity}"),
        ));
    }
    let unit_price = required(raw.unit_price_cents, field("unit_price_cents"))?;
    if !(0..=MAX_UNIT_PRICE).contains(&unit_price) {
        return Err(ValidationError::new(
            field("unit_price_cents"),
            format!("must be between 0 and {MAX_UNIT_PRICE}, got {unit_price}"),
        ));
    }
    Ok(NewOrderItem {
        sku,
        name,
        quantity: Quantity(i32::try_from(quantity).unwrap_or(i32::MAX)),
        unit_price: Money(unit_price),
    })
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn valid() -> Value {
        json!({
            "customer_email": "ada@example.com",
            "customer_name": "Ada Lovelace",
            "currency": "EUR",
            "items": [
                {"sku": "TEA-1", "name": "Green tea", "quantity": 2, "unit_price_cents": 450},
                {"sku": "MUG-2", "name": "Mug", "quantity": 1, "unit_price_cents": 1200}
            ]
        })
    }

    #[test]
    fn a_valid_body_parses_and_totals_its_lines() {
        let order = NewOrder::parse(&valid()).expect("valid order");
        assert_eq!(order.total().cents(), 2 * 450 + 1200);
        assert_eq!(order.items.len(), 2);
        assert_eq!(order.currency.code(), "EUR");
    }

    #[test]
    fn each_invalid_field_is_named_by_its_path() {
        let cases: Vec<(&str, Value, &str)> = vec![
            ("/customer_email", json!("not-an-email"), "customer_email"),
            (
                "/customer_email",
                json!("a@b.c\r\nBcc: x@y.z"),
                "customer_email",
            ),
            ("/customer_name", json!("   "), "customer_name"),
            ("/customer_name", json!("Eve\nBcc: x@y.z"), "customer_name"),
            ("/currency", json!("eur"), "currency"),
            ("/currency", json!(978), "currency"),
            ("/items", json!([]), "items"),
            ("/items/0/quantity", json!(0), "items[0].quantity"),
            ("/items/0/quantity", json!(-1), "items[0].quantity"),
            ("/items/0/quantity", json!(1.5), "items[0].quantity"),
            ("/items/0/quantity", json!("2"), "items[0].quantity"),
            (
                "/items/1/unit_price_cents",
                json!(-5),
                "items[1].unit_price_cents",
            ),
            (
                "/items/1/unit_price_cents",
                json!(1e30),
                "items[1].unit_price_cents",
            ),
            ("/items/1/sku", json!(""), "items[1].sku"),
        ];
        for (pointer, value, field) in cases {
            let mut body = valid();
            *body.pointer_mut(pointer).expect(pointer) = value.clone();
            let err = NewOrder::parse(&body).expect_err(pointer);
            assert_eq!(err.field, field, "{pointer} = {value}");
        }
    }

    #[test]
    fn missing_and_unknown_fields_are_refused() {
        let mut body = valid();
        body.as_object_mut().expect("object").remove("currency");
        assert_eq!(
            NewOrder::parse(&body).expect_err("missing").field,
            "currency"
        );

        let mut body = valid();
        body["items"][0]["quantiy"] = json!(3);
        assert_eq!(
            NewOrder::parse(&body).expect_err("typo").field,
            "items[0].quantiy"
        );

        assert_eq!(
            NewOrder::parse(&json!([1, 2])).expect_err("array").field,
            ""
        );
    }

    #[test]
    fn an_array_in_place_of_an_object_is_refused_not_read_by_position() {
        let mut body = valid();
        body["items"][0] = json!(["TEA-1", "Green tea", 2, 450]);
        let err = NewOrder::parse(&body).expect_err("item as array");
        assert_eq!(err.field, "items[0]");
        assert!(err.message.contains("expected a JSON object"), "{err}");

        let positional = json!(["ada@example.com", "Ada", "EUR", [valid()["items"][0]]]);
        assert_eq!(NewOrder::parse(&positional).expect_err("body").field, "");
    }

    #[test]
    fn a_type_error_keeps_serdes_reason() {
        let mut body = valid();
        body["items"][1]["quantity"] = json!("2");
        let err = NewOrder::parse(&body).expect_err("string quantity");
        assert_eq!(err.field, "items[1].quantity");
        assert!(err.message.contains("expected i64"), "{err}");

        let mut body = valid();
        body["items"][0]["quantiy"] = json!(3);
        let err = NewOrder::parse(&body).expect_err("typo");
        assert!(err.message.contains("unknown field `quantiy`"), "{err}");
    }

    #[test]
    fn too_many_items_are_refused() {
        let mut body = valid();
        let item = body["items"][0].clone();
        body["items"] = Value::Array(vec![item; MAX_ITEMS + 1]);
        assert_eq!(NewOrder::parse(&body).expect_err("too many").field, "items");
    }
}
