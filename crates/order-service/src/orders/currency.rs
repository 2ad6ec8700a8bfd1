//! ISO 4217 currency codes and their minor units, for validation and formatting.
//!
//! Our own table, weighed against iso_currency and kept: that crate has no
//! `ANG`, which orders already stored may carry (their receipt and email jobs
//! would then fail for good), and it marks `VES` withdrawn, which would refuse
//! orders our users place today. A change of the list is a change of what
//! the API accepts and what stored orders render, so it is made here, by hand,
//! with a test, rather than by a dependency update.

use std::fmt;

use diesel::deserialize::{self, FromSql, FromSqlRow};
use diesel::pg::{Pg, PgValue};
use diesel::sql_types::Text;
use serde::{Serialize, Serializer};

/// Currencies whose minor unit is not two digits. Everything else in
/// [`KNOWN`] has cents.
const ZERO_DECIMALS: &[&str] = &[
    "BIF", "CLP", "DJF", "GNF", "ISK", "JPY", "KMF", "KRW", "PYG", "RWF", "UGX", "UYI", "VND",
    "VUV", "XAF", "XOF", "XPF",
];
const THREE_DECIMALS: &[&str] = &["BHD", "IQD", "JOD", "KWD", "LYD", "OMR", "TND"];

/// Active ISO 4217 codes (funds and precious metals excluded).
const KNOWN: &[&str] = &[
    "AED", "AFN", "ALL", "AMD", "ANG", "AOA", "ARS", "AUD", "AWG", "AZN", "BAM", "BBD", "BDT",
    "BGN", "BHD", "BIF", "BMD", "BND", "BOB", "BRL", "BSD", "BTN", "BWP", "BYN", "BZD", "CAD",
    "CDF", "CHF", "CLP", "CNY", "COP", "CRC", "CUP", "CVE", "CZK", "DJF", "DKK", "DOP", "DZD",
    "EGP", "ERN", "ETB", "EUR", "FJD", "FKP", "GBP", "GEL", "GHS", "GIP", "GMD", "GNF", "GTQ",
    "GYD", "HKD", "HNL", "HTG", "HUF", "IDR", "ILS", "INR", "IQD", "IRR", "ISK", "JMD", "JOD",
    "JPY", "KES", "KGS", "KHR", "KMF", "KPW", "KRW", "KWD", "KYD", "KZT", "LAK", "LBP", "LKR",
    "LRD", "LSL", "LYD", "MAD", "MDL", "MGA", "MKD", "MMK", "MNT", "MOP", "MRU", "MUR", "MVR",
    "MWK", "MXN", "MYR", "MZN", "NAD", "NGN", "NIO", "NOK", "NPR", "NZD", "OMR", "PAB", "PEN",
    "PGK", "PHP", "PKR", "PLN", "PYG", "QAR", "RON", "RSD", "RUB", "RWF", "SAR", "SBD", "SCR",
    "SDG", "SEK", "SGD", "SHP", "SLE", "SOS", "SRD", "SSP", "STN", "SVC", "SYP", "SZL", "THB",
    "TJS", "TMT", "TND", "TOP", "TRY", "TTD", "TWD", "TZS", "UAH", "UGX", "USD", "UYI", "UYU",
    "UZS", "VES", "VND", "VUV", "WST", "XAF", "XCD", "XOF", "XPF", "YER", "ZAR", "ZMW", "ZWG",
];

/// A validated ISO 4217 currency code such as `EUR` or `JPY`; in JSON, the
/// code. Read from `orders.currency`, a code outside the list is an error
/// naming it, never a panic.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, FromSqlRow)]
pub struct Currency([u8; 3]);

impl Currency {
    /// Parses an upper-case ISO 4217 code; `None` for anything else.
    pub fn parse(raw: &str) -> Option<Currency> {
        let bytes: [u8; 3] = raw.as_bytes().try_into().ok()?;
        KNOWN.contains(&raw).then_some(Currency(bytes))
    }

    pub fn code(&self) -> &str {
        // Only ASCII codes from KNOWN are ever stored.
        std::str::from_utf8(&self.0).unwrap_or("XXX")
    }

    /// Digits after the decimal point: 0 for JPY, 3 for KWD, 2 for most.
    pub fn minor_units(&self) -> u32 {
        let code = self.code();
        if ZERO_DECIMALS.contains(&code) {
            0
        } else if THREE_DECIMALS.contains(&code) {
            3
        } else {
            2
        }
    }

    /// Formats an amount in minor units for people: `1,234.50 EUR`, `1,200 JPY`.
    pub fn format(&self, minor: i64) -> String {
        let digits = self.minor_units();
        let scale = 10_i128.pow(digits);
        let amount = i128::from(minor);
        let sign = if amount < 0 { "-" } else { "" };
        let whole = (amount.abs() / scale).to_string();
        let frac = amount.abs() % scale;
        let mut grouped = String::with_capacity(whole.len() + whole.len() / 3);
        for (i, ch) in whole.chars().enumerate() {
            if i > 0 && (whole.len() - i).is_multiple_of(3) {
                grouped.push(',');
            }
            grouped.push(ch);
        }
        if digits == 0 {
            format!("{sign}{grouped} {}", self.code())
        } else {
            format!(
                "{sign}{grouped}.{frac:0width$} {}",
                self.code(),
                width = digits as usize
            )
        }
    }
}

impl fmt::Display for Currency {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.code())
    }
}

impl Serialize for Currency {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_str(self.code())
    }
}

/// `orders.currency` is `char(3)`, which Diesel reads as text.
impl FromSql<Text, Pg> for Currency {
    fn from_sql(value: PgValue<'_>) -> deserialize::Result<Self> {
        let code = <String as FromSql<Text, Pg>>::from_sql(value)?;
        Currency::parse(&code)
            .ok_or_else(|| format!("orders.currency {code:?} is not a known ISO 4217 code").into())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn amounts_are_formatted_in_the_currencys_minor_units() {
        let cases = [
            ("EUR", 123_450, "1,234.50 EUR"),
            ("USD", 5, "0.05 USD"),
            ("JPY", 1200, "1,200 JPY"),
            ("KWD", 1_234_567, "1,234.567 KWD"),
            ("EUR", 0, "0.00 EUR"),
            ("EUR", -150, "-1.50 EUR"),
            ("USD", i64::MAX, "92,233,720,368,547,758.07 USD"),
        ];
        for (code, minor, expected) in cases {
            let currency = Currency::parse(code).expect(code);
            assert_eq!(currency.format(minor), expected, "{code} {minor}");
        }
    }

    #[test]
    fn only_known_upper_case_codes_parse() {
        assert!(Currency::parse("EUR").is_some());
        for bad in ["eur", "EU", "EURO", "XXX", "", "€", "ZZZ"] {
            assert!(Currency::parse(bad).is_none(), "{bad}");
        }
    }
}
