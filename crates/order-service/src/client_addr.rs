//! Who a request comes from: the peer's address, or, when the peer is one of
//! our own proxies (`TRUSTED_PROXIES`), the address that proxy saw.
//!
//! `X-Forwarded-For` is a list each proxy appends its peer to. Read from the
//! right, every hop a trusted proxy added is skipped; the first address that
//! is not one of ours is the client. Anything to its left was written by the
//! client itself and may be made up, so it is never believed, and without a
//! trusted peer the header is ignored altogether.

use std::net::{IpAddr, Ipv6Addr, SocketAddr};

use axum::http::HeaderMap;

/// Addresses and networks of the proxies in front of `serve`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct TrustedProxies(Vec<(IpAddr, u8)>);

impl TrustedProxies {
    /// `10.0.0.0/8, 192.168.1.7, fd00::/8`: IPs and CIDR networks, separated
    /// by commas or spaces. The error names the entry at fault.
    pub fn parse(raw: &str) -> Result<TrustedProxies, String> {
        let mut networks = Vec::new();
        for entry in raw
            .split([',', ' '])
            .map(str::trim)
            .filter(|e| !e.is_empty())
        {
            let (ip, prefix) = match entry.split_once('/') {
                Some((ip, prefix)) => (ip, Some(prefix)),
                None => (entry, None),
            };
            let ip: IpAddr = ip.parse().map_err(|_| {
                format!("{entry:?} is not an IP address or network such as 10.0.0.0/8")
            })?;
            let max = if ip.is_ipv4() { 32 } else { 128 };
            let prefix = match prefix {
                None => max,
                Some(p) => p
                    .parse::<u8>()
                    .ok()
                    .filter(|p| *p <= max)
                    .ok_or_else(|| format!("{entry:?} has a prefix length outside 0-{max}"))?,
            };
            networks.push((ip, prefix));
        }
        Ok(TrustedProxies(networks))
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    pub fn contains(&self, ip: IpAddr) -> bool {
        let ip = canonical(ip);
        self.0
            .iter()
            .any(|(network, prefix)| in_network(ip, canonical(*network), *prefix))
    }

    /// The client of a request from `peer` with `headers`.
    pub fn client(&self, peer: IpAddr, headers: &HeaderMap) -> IpAddr {
        let peer = canonical(peer);
        if !self.contains(peer) {
            return peer;
        }
        let mut client = peer;
        let hops = headers
            .get_all("x-forwarded-for")
            .iter()
            .filter_map(|v| v.to_str().ok())
            .flat_map(|v| v.split(','))
            .map(str::trim)
            .collect::<Vec<_>>();
        for hop in hops.iter().rev() {
            match parse_hop(hop) {
                Some(ip) if self.contains(ip) => client = ip,
                Some(ip) => return ip,
                // Garbage where an address should be: our proxy would not
                // write it, so it came from the client's side; stop at the
                // last address we could trust.
                None => return client,
            }
        }
        client
    }
}

/// One `X-Forwarded-For` entry: an IP, possibly with a port (`1.2.3.4:5678`,
/// `[::1]:80`).
fn parse_hop(hop: &str) -> Option<IpAddr> {
    if let Ok(ip) = hop.parse::<IpAddr>() {
        return Some(canonical(ip));
    }
    hop.parse::<SocketAddr>().ok().map(|s| canonical(s.ip()))
}

/// An IPv4 address mapped into IPv6 (a dual-stack listener's peers) as IPv4.
fn canonical(ip: IpAddr) -> IpAddr {
    match ip {
        IpAddr::V6(v6) => v6.to_ipv4_mapped().map_or(ip, IpAddr::V4),
        v4 => v4,
    }
}

fn in_network(ip: IpAddr, network: IpAddr, prefix: u8) -> bool {
    match (ip, network) {
        (IpAddr::V4(ip), IpAddr::V4(net)) => {
            let mask = u32::MAX.checked_shl(32 - u32::from(prefix)).unwrap_or(0);
            u32::from(ip) & mask == u32::from(net) & mask
        }
        (IpAddr::V6(ip), IpAddr::V6(net)) => {
            let mask = u128::MAX.checked_shl(128 - u32::from(prefix)).unwrap_or(0);
            u128::from(ip) & mask == u128::from(net) & mask
        }
        _ => false,
    }
}

/// The unit one client is counted in: an IPv4 address, or an IPv6 /64 (one
/// host usually holds a whole /64, and could otherwise pose as billions of
/// clients).
pub fn client_key(ip: IpAddr) -> IpAddr {
    match canonical(ip) {
        IpAddr::V6(v6) => IpAddr::V6(Ipv6Addr::from(u128::from(v6) & (u128::MAX << 64))),
        v4 => v4,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn headers(xff: &[&str]) -> HeaderMap {
        let mut headers = HeaderMap::new();
        for value in xff {
            headers.append("x-forwarded-for", value.parse().expect("header value"));
        }
        headers
    }

    fn ip(s: &str) -> IpAddr {
        s.parse().expect("IP")
    }

    #[test]
    fn entries_parse_and_bad_ones_are_named() {
        let trusted = TrustedProxies::parse("10.0.0.0/8, 192.168.1.7 fd00::/8").expect("valid");
        assert!(trusted.contains(ip("10.1.2.3")));
        assert!(trusted.contains(ip("::ffff:10.1.2.3")));
        assert!(trusted.contains(ip("192.168.1.7")));
        assert!(!trusted.contains(ip("192.168.1.8")));
        assert!(trusted.contains(ip("fd12::1")));
        assert!(!trusted.contains(ip("fe80::1")));
        assert!(TrustedProxies::parse("").expect("empty").is_empty());
        for bad in ["10.0.0.0/33", "proxy.internal", "::/129", "10.0.0.1/x"] {
            let error = TrustedProxies::parse(bad).expect_err(bad);
            assert!(error.contains(bad), "{error}");
        }
    }

    #[test]
    fn the_header_counts_only_behind_a_trusted_proxy() {
        let trusted = TrustedProxies::parse("10.0.0.0/8").expect("valid");
        let spoofed = headers(&["198.51.100.1"]);
        assert_eq!(
            trusted.client(ip("203.0.113.5"), &spoofed),
            ip("203.0.113.5")
        );
        assert_eq!(
            TrustedProxies::default().client(ip("10.0.0.2"), &spoofed),
            ip("10.0.0.2")
        );
        assert_eq!(trusted.client(ip("10.0.0.2"), &spoofed), ip("198.51.100.1"));
    }

    #[test]
    fn the_rightmost_untrusted_hop_is_the_client() {
        let trusted = TrustedProxies::parse("10.0.0.0/8").expect("valid");
        // The client wrote "1.1.1.1"; our proxies appended the rest.
        let chain = headers(&["1.1.1.1, 203.0.113.9", "10.0.0.7"]);
        assert_eq!(trusted.client(ip("10.0.0.2"), &chain), ip("203.0.113.9"));
        let with_port = headers(&["203.0.113.9:4711"]);
        assert_eq!(
            trusted.client(ip("10.0.0.2"), &with_port),
            ip("203.0.113.9")
        );
        let garbage = headers(&["not-an-ip, 10.0.0.9"]);
        assert_eq!(trusted.client(ip("10.0.0.2"), &garbage), ip("10.0.0.9"));
        assert_eq!(
            trusted.client(ip("10.0.0.2"), &HeaderMap::new()),
            ip("10.0.0.2")
        );
    }

    #[test]
    fn ipv6_clients_count_by_their_64() {
        assert_eq!(client_key(ip("2001:db8:1:2:3:4:5:6")), ip("2001:db8:1:2::"));
        assert_eq!(client_key(ip("::ffff:192.0.2.1")), ip("192.0.2.1"));
        assert_eq!(client_key(ip("192.0.2.1")), ip("192.0.2.1"));
    }
}
