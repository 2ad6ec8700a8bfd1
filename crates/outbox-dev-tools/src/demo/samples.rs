//! The demo's sample orders: customers whose names exercise the email
//! encoder and the receipt font (Cyrillic, Greek, Latin with diacritics),
//! and currencies with and without minor units (EUR, JPY, PLN).

use serde_json::{Value, json};

struct Sample {
    name: &'static str,
    /// Local part and domain; the nth repetition gets `+n` in the local part.
    email: (&'static str, &'static str),
    currency: &'static str,
    /// sku, name, quantity, unit price in minor units
    items: &'static [(&'static str, &'static str, i32, i64)],
}

const SAMPLES: [Sample; 5] = [
    Sample {
        name: "Анна Каренина",
        email: ("anna.karenina", "example.com"),
        currency: "EUR",
        items: &[
            ("SAMOVAR-1", "Самовар, латунь", 1, 8900),
            ("TEA-IVAN", "Чай «Иван-чай» 100 г", 3, 450),
        ],
    },
    Sample {
        name: "Yūki Tanaka",
        email: ("yuki.tanaka", "example.jp"),
        currency: "JPY",
        items: &[
            ("SENCHA-100", "Sencha green tea, 100 g", 2, 1800),
            ("KYUSU-1", "Kyūsu teapot", 1, 6500),
        ],
    },
    Sample {
        name: "Γιώργος Παπαδόπουλος",
        email: ("giorgos.papadopoulos", "example.gr"),
        currency: "EUR",
        items: &[
            ("OIL-1L", "Ελαιόλαδο, 1 λίτρο", 2, 1290),
            ("HONEY-450", "Μέλι θυμαρίσιο", 1, 990),
        ],
    },
    Sample {
        name: "François Lefèvre-Dvořák",
        email: ("francois.lefevre", "example.fr"),
        currency: "EUR",
        items: &[("CAFE-250", "Café moulu, 250 g", 4, 725)],
    },
    Sample {
        name: "Łucja Wróbel-Søndergaard",
        email: ("lucja.wrobel", "example.pl"),
        currency: "PLN",
        items: &[
            ("MUG-2", "Kubek ceramiczny", 2, 3499),
            ("TEA-1", "Herbata zielona", 1, 2450),
        ],
    },
];

/// The body of `POST /orders` for the `n`th sample order (from 0); the
/// samples repeat, with distinct email addresses, past the fifth.
pub fn order_body(n: usize) -> Value {
    let sample = &SAMPLES[n % SAMPLES.len()];
    let round = n / SAMPLES.len();
    let (local, domain) = sample.email;
    let email = if round == 0 {
        format!("{local}@{domain}")
    } else {
        format!("{local}+{}@{domain}", round + 1)
    };
    let items: Vec<Value> = sample
        .items
        .iter()
        .map(|(sku, name, quantity, unit_price_cents)| {
            json!({"sku": sku, "name": name, "quantity": quantity, "unit_price_cents": unit_price_cents})
        })
        .collect();
    json!({
        "customer_email": email,
        "customer_name": sample.name,
        "currency": sample.currency,
        "items": items,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use order_service::orders::NewOrder;

    #[test]
    fn every_sample_is_a_valid_order_and_repeats_get_their_own_address() {
        let mut emails = std::collections::HashSet::new();
        for n in 0..12 {
            let body = order_body(n);
            NewOrder::parse(&body).unwrap_or_else(|e| panic!("sample {n}: {e}"));
            assert!(emails.insert(body["customer_email"].to_string()), "{body}");
        }
    }
}
