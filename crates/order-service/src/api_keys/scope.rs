//! Scopes: what an API key may do. They follow the services that call the
//! API: a shop front places and reads orders, a payment service pays, a
//! warehouse ships and delivers, support cancels and refunds.

use std::fmt;
use std::str::FromStr;

/// One scope of the contract. The database's `api_keys_scopes_known` CHECK
/// lists the same names.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Scope {
    Place,
    Read,
    /// Reads only the orders placed with the same key: a shop front that
    /// shows customers their own orders, whose leak exposes nobody else's.
    ReadOwn,
    Pay,
    Ship,
    Deliver,
    Cancel,
    Refund,
    /// Every `orders:` scope, present and future.
    All,
}

impl Scope {
    pub const ALL: [Scope; 9] = [
        Scope::Place,
        Scope::Read,
        Scope::ReadOwn,
        Scope::Pay,
        Scope::Ship,
        Scope::Deliver,
        Scope::Cancel,
        Scope::Refund,
        Scope::All,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            Scope::Place => "orders:place",
            Scope::Read => "orders:read",
            Scope::ReadOwn => "orders:read:own",
            Scope::Pay => "orders:pay",
            Scope::Ship => "orders:ship",
            Scope::Deliver => "orders:deliver",
            Scope::Cancel => "orders:cancel",
            Scope::Refund => "orders:refund",
            Scope::All => "orders:*",
        }
    }

    /// The scope of `POST /orders/{id}/<action>`.
    pub fn of_action(action: &str) -> Option<Scope> {
        match action {
            "pay" => Some(Scope::Pay),
            "ship" => Some(Scope::Ship),
            "deliver" => Some(Scope::Deliver),
            "cancel" => Some(Scope::Cancel),
            "refund" => Some(Scope::Refund),
            _ => None,
        }
    }

    /// Whether a key holding `held` (as stored) may act under `self`.
    pub fn granted_by<S: AsRef<str>>(self, held: &[S]) -> bool {
        let granting = self.granting();
        held.iter().any(|s| granting.contains(&s.as_ref()))
    }

    /// The stored scopes that grant `self`: itself and the catch-all. What
    /// [`Self::granted_by`] looks for, for a statement that checks it.
    pub fn granting(self) -> [&'static str; 2] {
        [self.as_str(), Scope::All.as_str()]
    }
}

impl fmt::Display for Scope {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for Scope {
    type Err = String;

    fn from_str(raw: &str) -> Result<Scope, String> {
        Scope::ALL
            .into_iter()
            .find(|s| s.as_str() == raw)
            .ok_or_else(|| format!("unknown scope {raw:?}"))
    }
}

/// `orders:place,orders:read`: every scope known, at least one, no repeats
/// kept. An error names every unknown scope at once, and the known ones.
pub fn parse_scopes(raw: &str) -> Result<Vec<Scope>, String> {
    let mut scopes = Vec::new();
    let mut unknown = Vec::new();
    for part in raw.split(',').map(str::trim).filter(|p| !p.is_empty()) {
        match part.parse::<Scope>() {
            Ok(scope) if !scopes.contains(&scope) => scopes.push(scope),
            Ok(_) => {}
            Err(_) => unknown.push(format!("{:?}", crate::text::one_line(part, 40))),
        }
    }
    let known = || {
        Scope::ALL
            .iter()
            .map(|s| s.as_str())
            .collect::<Vec<_>>()
            .join(", ")
    };
    if !unknown.is_empty() {
        let noun = if unknown.len() == 1 {
            "unknown scope"
        } else {
            "unknown scopes"
        };
        return Err(format!("{noun} {}; known: {}", unknown.join(", "), known()));
    }
    if scopes.is_empty() {
        return Err(format!("name at least one scope; known: {}", known()));
    }
    Ok(scopes)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_unknown_scope_is_named() {
        let error = parse_scopes("orders:place,orders:fly,admin").expect_err("refused");
        assert!(error.contains("\"orders:fly\""), "{error}");
        assert!(error.contains("\"admin\""), "{error}");
        assert!(error.contains("orders:deliver"), "{error}");
    }

    #[test]
    fn scopes_parse_in_order_without_repeats() {
        assert_eq!(
            parse_scopes(" orders:read, orders:place ,orders:read").expect("valid"),
            vec![Scope::Read, Scope::Place]
        );
        assert!(parse_scopes(" , ").is_err());
    }

    #[test]
    fn the_wildcard_grants_every_scope_and_nothing_else_does() {
        assert!(Scope::Pay.granted_by(&["orders:*"]));
        assert!(Scope::Pay.granted_by(&["orders:read", "orders:pay"]));
        assert!(!Scope::Ship.granted_by(&["orders:pay", "orders:deliver"]));
        assert!(!Scope::Read.granted_by::<&str>(&[]));
        assert!(!Scope::Read.granted_by(&["orders:read:own"]));
        assert!(Scope::ReadOwn.granted_by(&["orders:*"]));
    }
}
