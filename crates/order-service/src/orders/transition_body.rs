//! The bodies of `POST /orders/{id}/{action}`, parsed into a
//! [`Transition`] at the edge: as strict as an order's (unknown fields
//! refused, every error naming its field). Their schemas (`/openapi.json`)
//! state the rules [`Transition::parse`] holds them to.

use serde::Deserialize;
use serde_json::Value;

use super::domain::DisplayText;
use super::json::{from_json, required};
use super::transition::Transition;
use super::validation::ValidationError;

const MAX_REFERENCE_CHARS: usize = 200;
const MAX_REASON_CHARS: usize = 500;

/// The bodies of the transitions as they arrive; as strict as an order's.
/// Their schemas (`/openapi.json`) state the rules `Transition::parse` holds them to.
#[derive(Debug, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct PayBody {
    #[schema(
        required = true,
        nullable = false,
        min_length = 1,
        max_length = 200,
        example = "pi_3Nk"
    )]
    payment_reference: Option<String>,
}

#[derive(Debug, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct ShipBody {
    #[schema(
        required = true,
        nullable = false,
        min_length = 1,
        max_length = 200,
        example = "DHL"
    )]
    carrier: Option<String>,
    #[schema(
        required = true,
        nullable = false,
        min_length = 1,
        max_length = 200,
        example = "JD014600006281"
    )]
    tracking_number: Option<String>,
}

#[derive(Debug, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct DeliverBody {}

#[derive(Debug, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct CancelBody {
    #[schema(
        required = true,
        nullable = false,
        min_length = 1,
        max_length = 500,
        example = "out of stock"
    )]
    reason: Option<String>,
}

/// Both optional: a refund needs no words, and a shop may not know the
/// provider's reference.
#[derive(Debug, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct RefundBody {
    #[schema(
        nullable = false,
        min_length = 1,
        max_length = 500,
        example = "returned"
    )]
    reason: Option<String>,
    #[schema(nullable = false, min_length = 1, max_length = 200, example = "pi_3Nk")]
    payment_reference: Option<String>,
}

impl Transition {
    /// The `{action}` of `POST /orders/{id}/{action}`.
    pub const ACTIONS: [&'static str; 5] = ["pay", "ship", "deliver", "cancel", "refund"];

    /// Parses the JSON body of `POST /orders/{id}/{action}`; as strict as an order:
    /// unknown fields are refused, every error names its field.
    pub fn parse(action: &str, body: &Value) -> Result<Transition, ValidationError> {
        let text = |value: Option<String>,
                    name: &str,
                    max: usize|
         -> Result<DisplayText, ValidationError> {
            DisplayText::parse(&required(value, name)?, max)
                .map_err(|m| ValidationError::new(name, m))
        };
        match action {
            "pay" => {
                let body: PayBody = from_json(body)?;
                Ok(Transition::Pay {
                    payment_reference: text(
                        body.payment_reference,
                        "payment_reference",
                        MAX_REFERENCE_CHARS,
                    )?,
                })
            }
            "ship" => {
                let body: ShipBody = from_json(body)?;
                Ok(Transition::Ship {
                    carrier: text(body.carrier, "carrier", MAX_REFERENCE_CHARS)?,
                    tracking_number: text(
                        body.tracking_number,
                        "tracking_number",
                        MAX_REFERENCE_CHARS,
                    )?,
                })
            }
            "deliver" => {
                let DeliverBody {} = from_json(body)?;
                Ok(Transition::Deliver)
            }
            "cancel" => {
                let body: CancelBody = from_json(body)?;
                Ok(Transition::Cancel {
                    reason: text(body.reason, "reason", MAX_REASON_CHARS)?,
                })
            }
            "refund" => {
                let body: RefundBody = from_json(body)?;
                let optional = |value: Option<String>, name: &str, max: usize| {
                    value
                        .map(|v| {
                            DisplayText::parse(&v, max).map_err(|m| ValidationError::new(name, m))
                        })
                        .transpose()
                };
                Ok(Transition::Refund {
                    reason: optional(body.reason, "reason", MAX_REASON_CHARS)?,
                    payment_reference: optional(
                        body.payment_reference,
                        "payment_reference",
                        MAX_REFERENCE_CHARS,
                    )?,
                })
            }
            other => Err(ValidationError::new(
                "",
                format!("{other:?} is not a transition"),
            )),
        }
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn bodies_are_parsed_strictly_with_field_paths() {
        let ship = Transition::parse(
            "ship",
            &json!({"carrier": "DHL", "tracking_number": "JD0001"}),
        );
        assert!(matches!(ship, Ok(Transition::Ship { .. })));
        let missing = Transition::parse("ship", &json!({"carrier": "DHL"})).expect_err("missing");
        assert_eq!(missing.field, "tracking_number");
        let unknown = Transition::parse("deliver", &json!({"when": "now"})).expect_err("unknown");
        assert_eq!(unknown.field, "when");
        let empty = Transition::parse("cancel", &json!({"reason": "  "})).expect_err("empty");
        assert_eq!(empty.field, "reason");
        assert!(Transition::parse("pay", &json!([])).is_err());
    }
}
