//! Keeps deliveries off the shop's own network: an endpoint URL whose host
//! is, or resolves to, a loopback, private, link-local or otherwise
//! non-public address is refused at connect time, unless
//! `WEBHOOK_ALLOW_PRIVATE=true` (tests and the demo, whose receivers run on
//! 127.0.0.1).
//!
//! The check runs on the addresses the connection will actually use: the
//! resolver hands reqwest only the addresses that pass, so a name that
//! resolves to a public address when the endpoint is added and to 127.0.0.1
//! when a delivery goes out (DNS rebinding) still cannot reach 127.0.0.1.
//! reqwest does not call a resolver for a literal IP in the URL, so
//! [`check_literal_host`] covers those before the request is made.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};

use reqwest::dns::{Addrs, Name, Resolve, Resolving};

/// Whether an address is one a delivery must not reach: anything but a
/// public unicast address.
pub fn is_forbidden(ip: IpAddr) -> bool {
    match ip {
        IpAddr::V4(v4) => is_forbidden_v4(v4),
        IpAddr::V6(v6) => match (v6.to_ipv4_mapped(), v6.segments()) {
            // ::ffff:127.0.0.1 reaches 127.0.0.1.
            (Some(v4), _) => is_forbidden_v4(v4),
            // ::ffff:0:a.b.c.d (IPv4-translated, SIIT) reaches a.b.c.d too.
            (None, [0, 0, 0, 0, 0xffff, 0, c, d]) => is_forbidden_v4(embedded_v4(c, d)),
            (None, _) => is_forbidden_v6(v6),
        },
    }
}

fn is_forbidden_v4(ip: Ipv4Addr) -> bool {
    let [a, b, ..] = ip.octets();
    ip.is_loopback()
        || ip.is_private()
        || ip.is_link_local()
        || ip.is_unspecified()
        || ip.is_broadcast()
        || ip.is_multicast()
        || ip.is_documentation()
        // 0.0.0.0/8 ("this network"), 100.64.0.0/10 (carrier-grade NAT),
        // 192.0.0.0/24 (protocol assignments), 198.18.0.0/15 (benchmarking),
        // 240.0.0.0/4 (reserved).
        || a == 0
        || (a == 100 && (64..128).contains(&b))
        || (a == 192 && b == 0 && ip.octets()[2] == 0)
        || (a == 198 && (b == 18 || b == 19))
        || a >= 240
}

fn is_forbidden_v6(ip: Ipv6Addr) -> bool {
    let first = ip.segments()[0];
    ip.is_loopback()
        || ip.is_unspecified()
        || ip.is_multicast()
        // fc00::/7 unique local, fe80::/10 link-local, fec0::/10 site-local
        // (deprecated, still routed inside some networks), 2001:db8::/32
        // documentation.
        || (first & 0xfe00) == 0xfc00
        || (first & 0xffc0) == 0xfe80
        || (first & 0xffc0) == 0xfec0
        // 64:ff9b:1::/48: NAT64 prefixes for local use, which translate to
        // the operator's own IPv4 networks.
        || (first == 0x0064 && ip.segments()[1] == 0xff9b && ip.segments()[2] == 0x0001)
        || (first == 0x2001 && ip.segments()[1] == 0x0db8)
        // 64:ff9b::/96 (NAT64) embeds an IPv4 address, which may be private.
        || (first == 0x0064 && ip.segments()[1] == 0xff9b && {
            let [.., c, d] = ip.segments();
            is_forbidden_v4(embedded_v4(c, d))
        })
}

/// The IPv4 address in the last 32 bits of an IPv6 address.
fn embedded_v4(c: u16, d: u16) -> Ipv4Addr {
    let [c1, c2] = c.to_be_bytes();
    let [d1, d2] = d.to_be_bytes();
    Ipv4Addr::new(c1, c2, d1, d2)
}

/// Refuses `host` (a name or a literal address) when it is, or resolves to,
/// a forbidden address: for clients that resolve names themselves (NATS),
/// where the check cannot sit in the resolver, so every address must pass.
pub async fn check_host(host: &str, port: u16) -> Result<(), String> {
    let host = host.trim_start_matches('[').trim_end_matches(']');
    let found: Vec<SocketAddr> = tokio::net::lookup_host((host, port))
        .await
        .map_err(|e| format!("cannot resolve {host}: {e}"))?
        .collect();
    let forbidden: Vec<String> = found
        .iter()
        .filter(|addr| is_forbidden(addr.ip()))
        .map(|addr| addr.ip().to_string())
        .collect();
    if forbidden.is_empty() {
        Ok(())
    } else {
        Err(format!(
            "{host} is or resolves to loopback, private or link-local addresses ({}); \
             connections to them are refused (WEBHOOK_ALLOW_PRIVATE=true allows them)",
            forbidden.join(", ")
        ))
    }
}

/// Refuses a URL whose host is a literal forbidden address.
pub fn check_literal_host(url: &url::Url) -> Result<(), String> {
    let ip = match url.host() {
        Some(url::Host::Ipv4(v4)) => IpAddr::V4(v4),
        Some(url::Host::Ipv6(v6)) => IpAddr::V6(v6),
        _ => return Ok(()),
    };
    if is_forbidden(ip) {
        Err(format!(
            "{ip} is a loopback, private or link-local address; deliveries to it are refused \
             (WEBHOOK_ALLOW_PRIVATE=true allows them)"
        ))
    } else {
        Ok(())
    }
}

/// A resolver that looks names up as the system does and keeps only the
/// public addresses; a name with none left is an error naming it.
#[derive(Debug, Clone, Copy, Default)]
pub struct PublicOnlyResolver;

impl Resolve for PublicOnlyResolver {
    fn resolve(&self, name: Name) -> Resolving {
        let host = name.as_str().to_owned();
        Box::pin(async move {
            // Port 0: reqwest puts the URL's port on the addresses it is given.
            let found: Vec<SocketAddr> =
                tokio::net::lookup_host((host.as_str(), 0)).await?.collect();
            let public: Vec<SocketAddr> = found
                .iter()
                .copied()
                .filter(|addr| !is_forbidden(addr.ip()))
                .collect();
            if public.is_empty() {
                let shown: Vec<String> = found.iter().map(|a| a.ip().to_string()).collect();
                return Err(format!(
                    "{host} resolves only to loopback, private or link-local addresses ({}); \
                     deliveries to them are refused (WEBHOOK_ALLOW_PRIVATE=true allows them)",
                    shown.join(", ")
                )
                .into());
            }
            let addrs: Addrs = Box::new(public.into_iter());
            Ok(addrs)
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_public_unicast_addresses_are_allowed() {
        for forbidden in [
            "127.0.0.1",
            "10.1.2.3",
            "172.16.0.1",
            "172.31.255.255",
            "192.168.1.1",
            "169.254.169.254",
            "0.0.0.0",
            "0.1.2.3",
            "100.64.0.1",
            "255.255.255.255",
            "224.0.0.1",
            "::1",
            "::",
            "fd00::1",
            "fe80::1",
            "::ffff:127.0.0.1",
            "::ffff:10.0.0.1",
            "64:ff9b::a00:1",
        ] {
            let ip: IpAddr = forbidden.parse().expect(forbidden);
            assert!(is_forbidden(ip), "{forbidden} is allowed");
        }
        for allowed in [
            "93.184.216.34",
            "172.32.0.1",
            "100.128.0.1",
            "2606:4700::1111",
            "64:ff9b::5db8:d822",
        ] {
            let ip: IpAddr = allowed.parse().expect(allowed);
            assert!(!is_forbidden(ip), "{allowed} is refused");
        }
    }

    #[test]
    fn translated_local_nat64_and_site_local_ipv6_forms_are_refused() {
        for forbidden in [
            // IPv4-translated (SIIT) forms of private and loopback addresses.
            "::ffff:0:127.0.0.1",
            "::ffff:0:10.0.0.1",
            "::ffff:0:169.254.169.254",
            // Local-use NAT64, whatever IPv4 address it embeds.
            "64:ff9b:1::a00:1",
            "64:ff9b:1:ffff::5db8:d822",
            // Site-local.
            "fec0::1",
            "feff:ffff::1",
        ] {
            let ip: IpAddr = forbidden.parse().expect(forbidden);
            assert!(is_forbidden(ip), "{forbidden} is allowed");
        }
        let public: IpAddr = "::ffff:0:93.184.216.34".parse().expect("an address");
        assert!(!is_forbidden(public));
    }

    #[tokio::test]
    async fn a_host_a_client_resolves_itself_must_have_only_public_addresses() {
        assert!(check_host("127.0.0.1", 4222).await.is_err());
        assert!(check_host("[::1]", 4222).await.is_err());
        assert!(check_host("localhost", 4222).await.is_err());
        assert!(check_host("93.184.216.34", 4222).await.is_ok());
    }

    #[test]
    fn a_literal_private_host_is_refused_and_a_name_is_left_to_the_resolver() {
        let refused = |raw: &str| check_literal_host(&url::Url::parse(raw).expect(raw));
        assert!(refused("http://127.0.0.1:8080/hooks").is_err());
        assert!(refused("http://[::1]/hooks").is_err());
        assert!(refused("https://169.254.169.254/latest/meta-data").is_err());
        assert!(refused("https://93.184.216.34/").is_ok());
        assert!(refused("https://hooks.example.com/").is_ok());
    }

    #[tokio::test]
    async fn the_resolver_drops_private_answers_and_refuses_a_name_with_none_left() {
        let name: Name = "localhost".parse().expect("a name");
        let error = PublicOnlyResolver
            .resolve(name)
            .await
            .err()
            .expect("localhost resolves only to loopback");
        let said = error.to_string();
        assert!(
            said.starts_with("localhost resolves only to loopback"),
            "{said}"
        );
        assert!(said.contains("127.0.0.1") || said.contains("::1"), "{said}");
    }
}
