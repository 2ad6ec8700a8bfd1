//! `--arrival-rate`: the order rates of the open-loop runs, each either in
//! orders per second or as a share of the API's maximum measured in the same
//! run by the saturation (flat-out) placement run.

use std::fmt;

/// More than any API on one machine answers; a typo past it is an error.
const MAX_ORDERS_PER_SECOND: f64 = 1_000_000.0;

#[derive(Debug, Clone, Copy, PartialEq)]
pub enum ArrivalRate {
    /// Orders per second.
    PerSecond(f64),
    /// A share (0 < s <= 1) of the saturation run's orders per second.
    Share(f64),
}

impl ArrivalRate {
    /// Orders per second; `None` for a share when no saturation run measured
    /// the maximum.
    pub fn resolve(self, saturation: Option<f64>) -> Option<f64> {
        match self {
            ArrivalRate::PerSecond(rate) => Some(rate),
            ArrivalRate::Share(share) => saturation
                .filter(|max| max.is_finite() && *max > 0.0)
                .map(|max| max * share),
        }
    }
}

impl fmt::Display for ArrivalRate {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ArrivalRate::PerSecond(rate) => write!(f, "{rate}/s"),
            ArrivalRate::Share(share) => write!(f, "{}%", share * 100.0),
        }
    }
}

/// One `--arrival-rate` value (clap splits the comma list): `200` orders per
/// second, or `50%` of the measured maximum. Above 100% is refused: the API
/// cannot place more than its maximum, so such a run would measure only the
/// load generator's backlog; an absolute rate still overloads on purpose.
pub fn parse_arrival_rate(raw: &str) -> Result<ArrivalRate, String> {
    const EXPECTED: &str =
        "expected orders per second (such as 200) or a share of the measured maximum (such as 50%)";
    let raw = raw.trim();
    let (number, share) = match raw.strip_suffix('%') {
        Some(number) => (number.trim(), true),
        None => (raw.strip_suffix("/s").unwrap_or(raw).trim(), false),
    };
    let value: f64 = number.parse().map_err(|_| EXPECTED.to_owned())?;
    if !value.is_finite() {
        return Err(EXPECTED.to_owned());
    }
    if value <= 0.0 {
        return Err("must be more than zero".to_owned());
    }
    if share {
        if value > 100.0 {
            return Err("a share of the measured maximum must be at most 100%".to_owned());
        }
        Ok(ArrivalRate::Share(value / 100.0))
    } else {
        if value > MAX_ORDERS_PER_SECOND {
            return Err(format!(
                "must be at most {MAX_ORDERS_PER_SECOND} orders per second"
            ));
        }
        Ok(ArrivalRate::PerSecond(value))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_plain_number_is_orders_per_second() {
        assert_eq!(parse_arrival_rate("200"), Ok(ArrivalRate::PerSecond(200.0)));
        assert_eq!(
            parse_arrival_rate(" 12.5 "),
            Ok(ArrivalRate::PerSecond(12.5))
        );
        assert_eq!(
            parse_arrival_rate("400/s"),
            Ok(ArrivalRate::PerSecond(400.0))
        );
    }

    #[test]
    fn a_percentage_is_a_share_of_the_measured_maximum() {
        assert_eq!(parse_arrival_rate("50%"), Ok(ArrivalRate::Share(0.5)));
        assert_eq!(parse_arrival_rate("100%"), Ok(ArrivalRate::Share(1.0)));
        assert_eq!(ArrivalRate::Share(0.8).resolve(Some(1000.0)), Some(800.0));
        assert_eq!(ArrivalRate::Share(0.8).resolve(None), None);
        assert_eq!(ArrivalRate::Share(0.8).resolve(Some(0.0)), None);
        assert_eq!(ArrivalRate::PerSecond(300.0).resolve(None), Some(300.0));
    }

    #[test]
    fn zero_negative_and_nonsense_are_refused_with_a_reason() {
        for raw in ["0", "0%", "-5", "-50%", "0.0"] {
            assert_eq!(
                parse_arrival_rate(raw),
                Err("must be more than zero".to_owned()),
                "{raw}"
            );
        }
        for raw in ["abc", "", "%", "50%%", "inf", "NaN", "5 0", "1e999"] {
            let error = parse_arrival_rate(raw).expect_err(raw);
            assert!(
                error.starts_with("expected orders per second"),
                "{raw}: {error}"
            );
        }
        assert!(
            parse_arrival_rate("150%")
                .expect_err("over 100%")
                .contains("at most 100%")
        );
        assert!(parse_arrival_rate("2000000").is_err());
    }

    #[test]
    fn rates_read_back_as_given() {
        assert_eq!(ArrivalRate::Share(0.5).to_string(), "50%");
        assert_eq!(ArrivalRate::PerSecond(200.0).to_string(), "200/s");
    }
}
