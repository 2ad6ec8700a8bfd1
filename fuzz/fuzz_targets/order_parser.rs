//! The order parser on arbitrary bytes, as `POST /orders` receives them: any
//! JSON value must parse to an order within the limits or to a validation
//! error naming a field, and never panic.
#![no_main]

use libfuzzer_sys::fuzz_target;
use order_service::orders::{MAX_ITEMS, MAX_QUANTITY, MAX_UNIT_PRICE, NewOrder};

fuzz_target!(|data: &[u8]| {
    let Ok(value) = serde_json::from_slice::<serde_json::Value>(data) else {
        return;
    };
    match NewOrder::parse(&value) {
        Ok(order) => {
            assert!((1..=MAX_ITEMS).contains(&order.items().len()));
            let mut total = 0_i64;
            for item in order.items() {
                assert!((1..=MAX_QUANTITY).contains(&i64::from(item.quantity.get())));
                assert!((0..=MAX_UNIT_PRICE).contains(&item.unit_price.cents()));
                assert!(!item.name.as_str().chars().any(char::is_control));
                assert!(!item.sku.as_str().chars().any(char::is_control));
                total = total
                    .checked_add(item.line_total().cents())
                    .expect("the limits keep the total in range");
            }
            assert_eq!(order.total().cents(), total);
            assert!(!order.customer_name.as_str().chars().any(char::is_control));
            assert!(!order.customer_email.as_str().contains(['\r', '\n', '\0']));
        }
        Err(error) => assert!(!error.message.is_empty()),
    }
});
