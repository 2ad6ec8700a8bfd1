//! `DATABASE_URL` checked at start, in libpq's URL form, which has one host or
//! a list of them (`postgres://u@h1:5432,h2:5433/db?target_session_attrs=read-write`):
//! the form a failover needs. The `url` crate takes a host list for a bad port,
//! so the list is read here, and only a single-host URL goes to the `url` crate.

/// The `target_session_attrs` values the outbox can run with: it writes, so it
/// needs the primary. libpq's others (`read-only`, `standby`,
/// `prefer-standby`) would put it on a standby.
const WRITABLE_ATTRS: [&str; 3] = ["any", "read-write", "primary"];
const STANDBY_ATTRS: [&str; 3] = ["read-only", "standby", "prefer-standby"];

/// A PostgreSQL URL (`postgres://` or `postgresql://`), with one host or a
/// comma-separated list of `host[:port]`, and a `target_session_attrs` that
/// reaches a writable server. The error names the bad part.
pub fn parse_database_url(raw: &str) -> Result<String, String> {
    let Some((scheme, rest)) = raw.split_once("://") else {
        return Err("not a URL: expected postgres://user@host:port/database".into());
    };
    if scheme != "postgres" && scheme != "postgresql" {
        return Err(format!(
            "scheme {scheme:?} is not postgres:// or postgresql://"
        ));
    }
    let end = rest.find(['/', '?']).unwrap_or(rest.len());
    let (authority, tail) = rest.split_at(end);
    let hosts = authority
        .rsplit_once('@')
        .map_or(authority, |(_, hosts)| hosts);
    if hosts.contains(',') {
        check_host_list(hosts)?;
    } else {
        url::Url::parse(raw).map_err(|e| format!("not a URL: {e}"))?;
    }
    if let Some((_, query)) = tail.split_once('?') {
        for (key, value) in url::form_urlencoded::parse(query.as_bytes()) {
            if key == "target_session_attrs" {
                check_session_attrs(&value)?;
            }
        }
    }
    Ok(raw.to_owned())
}

fn check_host_list(hosts: &str) -> Result<(), String> {
    for (n, entry) in hosts.split(',').enumerate() {
        let n = n + 1;
        let (host, port) = split_port(entry).ok_or_else(|| {
            format!("host {n} of the host list {hosts:?} is malformed: {entry:?}")
        })?;
        if host.is_empty() {
            return Err(format!(
                "host {n} of the host list {hosts:?} is empty (expected host[:port],host[:port])"
            ));
        }
        if let Some(port) = port
            && !port.parse::<u16>().is_ok_and(|p| p > 0)
        {
            return Err(format!(
                "host {n} of the host list {hosts:?} has port {port:?}, not a number from 1 to 65535"
            ));
        }
    }
    Ok(())
}

/// `host[:port]` or `[v6 address][:port]`; `None` for a bracket left open.
fn split_port(entry: &str) -> Option<(&str, Option<&str>)> {
    if let Some(bracketed) = entry.strip_prefix('[') {
        let (address, after) = bracketed.split_once(']')?;
        return match after {
            "" => Some((address, None)),
            _ => Some((address, Some(after.strip_prefix(':')?))),
        };
    }
    Some(match entry.split_once(':') {
        Some((host, port)) => (host, Some(port)),
        None => (entry, None),
    })
}

fn check_session_attrs(value: &str) -> Result<(), String> {
    if WRITABLE_ATTRS.contains(&value) {
        Ok(())
    } else if STANDBY_ATTRS.contains(&value) {
        Err(format!(
            "target_session_attrs={value} would connect to a standby, where the outbox cannot write; use read-write"
        ))
    } else {
        Err(format!(
            "target_session_attrs={value:?} is not one of {} (libpq's values for a writable server)",
            WRITABLE_ATTRS.join(", ")
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_host_list_with_target_session_attrs_is_taken() {
        for url in [
            "postgres://u@127.0.0.1:5433,127.0.0.1:5434/db?target_session_attrs=read-write",
            "postgresql://u:p@db1.example,db2.example:6432/db?sslmode=require&target_session_attrs=primary",
            "postgres://u@[::1]:5433,[fe80::1]/db",
            "postgres://u@localhost/db",
        ] {
            assert_eq!(parse_database_url(url).as_deref(), Ok(url), "{url}");
        }
    }

    #[test]
    fn a_malformed_host_list_is_refused_naming_the_bad_host() {
        let error = parse_database_url("postgres://u@h1:5432,h2:54x2/db").expect_err("refused");
        assert!(
            error.contains("host 2") && error.contains("54x2"),
            "{error}"
        );
        let error = parse_database_url("postgres://u@h1,,h3/db").expect_err("refused");
        assert!(
            error.contains("host 2") && error.contains("empty"),
            "{error}"
        );
        let error = parse_database_url("postgres://u@h1,h2:70000/db").expect_err("refused");
        assert!(error.contains("70000"), "{error}");
        let error = parse_database_url("postgres://u@h1,[::1/db").expect_err("refused");
        assert!(error.contains("[::1"), "{error}");
    }

    #[test]
    fn an_unknown_or_standby_target_session_attrs_is_refused_by_value() {
        let error = parse_database_url("postgres://u@h1,h2/db?target_session_attrs=writable")
            .expect_err("refused");
        assert!(
            error.contains("\"writable\"") && error.contains("read-write"),
            "{error}"
        );
        let error = parse_database_url("postgres://u@h/db?target_session_attrs=standby")
            .expect_err("refused");
        assert!(error.contains("standby"), "{error}");
    }
}
