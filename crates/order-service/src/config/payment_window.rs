//! `ORDER_PAYMENT_WINDOW`: how long a placed order may wait for its payment
//! before it expires. Read by `serve`, which stores each order's
//! `expires_at` when it places it, and by relays, which sweep for the due
//! orders while it is set.

use std::time::Duration;

use clap::Args;

/// The shortest window: the relays sweep every second, so a shorter one
/// could not be kept to.
pub const MIN_PAYMENT_WINDOW: Duration = Duration::from_secs(1);
/// The longest window: past it an `expires_at` is a date no shop means.
pub const MAX_PAYMENT_WINDOW: Duration = Duration::from_secs(3650 * 86_400);

#[derive(Debug, Clone, Args)]
pub struct PaymentWindowArgs {
    /// How long a new order may stay unpaid before it expires (event
    /// order.expired, an email to the customer): 30m, 24h, 7d; `off`: never.
    /// The window in force when an order is placed is the one it keeps. Set
    /// it on `serve` and on the relays: a relay sweeps for due orders every
    /// second while it is set.
    #[arg(long, env = "ORDER_PAYMENT_WINDOW", default_value = "off", value_parser = parse_payment_window)]
    pub payment_window: PaymentWindow,
}

/// A payment window, or none (`off`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct PaymentWindow(Option<Duration>);

impl PaymentWindow {
    pub const OFF: PaymentWindow = PaymentWindow(None);

    /// The window; `None` when orders never expire.
    pub fn get(self) -> Option<Duration> {
        self.0
    }
}

/// `off`, or a duration from [`MIN_PAYMENT_WINDOW`] to
/// [`MAX_PAYMENT_WINDOW`] in whole milliseconds.
pub fn parse_payment_window(raw: &str) -> Result<PaymentWindow, String> {
    let text = raw.trim();
    if text.eq_ignore_ascii_case("off") {
        return Ok(PaymentWindow::OFF);
    }
    let expected = "expected `off` or a duration such as 30m, 24h or 7d";
    if text.starts_with('-') {
        return Err(format!("a window cannot be negative ({expected})"));
    }
    let window = humantime::parse_duration(text).map_err(|e| format!("{e} ({expected})"))?;
    if window.is_zero() {
        return Err(format!("a window must be more than zero ({expected})"));
    }
    if window < MIN_PAYMENT_WINDOW {
        return Err(format!(
            "must be at least {} (relays sweep every second)",
            humantime::format_duration(MIN_PAYMENT_WINDOW)
        ));
    }
    if window > MAX_PAYMENT_WINDOW {
        return Err(format!(
            "must be at most {}",
            humantime::format_duration(MAX_PAYMENT_WINDOW)
        ));
    }
    if !window.subsec_nanos().is_multiple_of(1_000_000) {
        return Err("must be whole milliseconds".into());
    }
    Ok(PaymentWindow(Some(window)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn off_and_durations_parse_and_zero_negative_or_garbage_do_not() {
        assert_eq!(parse_payment_window("off"), Ok(PaymentWindow::OFF));
        assert_eq!(parse_payment_window(" OFF "), Ok(PaymentWindow::OFF));
        assert_eq!(
            parse_payment_window("30m").map(PaymentWindow::get),
            Ok(Some(Duration::from_secs(1800)))
        );
        assert_eq!(
            parse_payment_window("1500ms").map(PaymentWindow::get),
            Ok(Some(Duration::from_millis(1500)))
        );
        for bad in ["0", "0s", "-5m", "soon", "", "500ms", "20y"] {
            assert!(parse_payment_window(bad).is_err(), "{bad:?} is refused");
        }
        let negative = parse_payment_window("-5m").expect_err("negative");
        assert!(negative.contains("negative"), "{negative}");
    }
}
