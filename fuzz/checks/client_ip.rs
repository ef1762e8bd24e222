//! `ClientIpKey` over arbitrary `X-Forwarded-For`, `Forwarded` and
//! `X-Real-IP` headers, checked against its docs: it never panics; the same
//! request gives the same key; with no trusted proxy the key is the peer's
//! address and no header is read; with `n` trusted proxies it is the `n`-th
//! entry from the right of the one header they write (all its lines, in
//! order), when that entry is an address (bare, `[v6]`, `[v6]:port` or
//! `v4:port`), else the peer's; `X-Real-IP` counts only with one trusted
//! proxy and one value. The key is always a real address that appears in
//! the input (peer or that entry), IPv4-mapped IPv6 as IPv4, IPv6 cut to
//! its prefix; and it is shown only as its fingerprint unless `show_raw`.
//!
//! Input: a byte for the header the proxies write, one for how many are
//! trusted, one for the IPv6 prefix, one for the peer (none, v4, v6 or a
//! socket address, from the next 16 bytes), then header lines: a byte for
//! the name, the value up to the next newline.
//!
//! Shared by the fuzz target and `tests/fuzz_corpora.rs` (by `#[path]`).

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};

use http::HeaderValue;
use tower_throttle::key::{ClientIpKey, ProxyHeader, key_label, key_text};
use tower_throttle::redact::fingerprint;

const NAMES: [&str; 5] = [
    "x-forwarded-for",
    "forwarded",
    "x-real-ip",
    "x-client-ip",
    "cf-connecting-ip",
];

/// An address as the docs say proxies write it.
fn strict_ip(text: &str) -> Option<IpAddr> {
    if let Ok(ip) = text.parse::<IpAddr>() {
        return Some(ip);
    }
    if let Some(rest) = text.strip_prefix('[') {
        let (inside, after) = rest.split_once(']')?;
        let ip = inside.parse::<Ipv6Addr>().ok()?;
        let port_ok = after.is_empty()
            || after
                .strip_prefix(':')
                .is_some_and(|p| p.parse::<u16>().is_ok());
        return port_ok.then_some(IpAddr::V6(ip));
    }
    let (host, port) = text.rsplit_once(':')?;
    let ip = host.parse::<Ipv4Addr>().ok()?;
    port.parse::<u16>().ok().map(|_| IpAddr::V4(ip))
}

/// The part of `ip` a client is keyed by.
fn keyed(ip: IpAddr, prefix: u8) -> IpAddr {
    match ip.to_canonical() {
        IpAddr::V6(v6) => {
            let bits = u32::from(prefix.min(128));
            let mask = if bits == 0 {
                0
            } else {
                u128::MAX << (128 - bits)
            };
            IpAddr::V6(Ipv6Addr::from(u128::from(v6) & mask))
        }
        v4 => v4,
    }
}

/// The `for=` value of one `Forwarded` element.
fn forwarded_for(element: &str) -> Option<&str> {
    element.split(';').find_map(|pair| {
        let (name, value) = pair.split_once('=')?;
        name.trim()
            .eq_ignore_ascii_case("for")
            .then(|| value.trim().trim_matches('"'))
    })
}

/// Decode `data` into a request and a key, and check the key's answer.
pub fn check(data: &[u8]) {
    if data.len() < 20 {
        return;
    }
    let via = [
        ProxyHeader::XForwardedFor,
        ProxyHeader::Forwarded,
        ProxyHeader::XRealIp,
    ][usize::from(data[0]) % 3];
    let trusted = usize::from(data[1] % 5);
    let prefix = data[2];
    let mut b16 = [0u8; 16];
    b16.copy_from_slice(&data[4..20]);
    let peer: Option<IpAddr> = match data[3] % 4 {
        0 => None,
        1 => Some(IpAddr::V4(Ipv4Addr::new(b16[0], b16[1], b16[2], b16[3]))),
        _ => Some(IpAddr::V6(Ipv6Addr::from(b16))),
    };
    let mut req = http::Request::new(());
    if let Some(ip) = peer {
        if data[3] % 4 == 3 {
            req.extensions_mut().insert(SocketAddr::new(ip, 443));
        } else {
            req.extensions_mut().insert(ip);
        }
    }
    for line in data[20..].split(|&b| b == b'\n') {
        let Some((&name, value)) = line.split_first() else {
            continue;
        };
        if let Ok(value) = HeaderValue::from_bytes(value) {
            req.headers_mut()
                .append(NAMES[usize::from(name) % NAMES.len()], value);
        }
    }

    let key = ClientIpKey::new()
        .trust_proxies(trusted)
        .via(via)
        .ipv6_prefix(prefix);
    let got = key_text(&key, &req);
    assert_eq!(
        got.as_ref().ok(),
        key_text(&key, &req).as_ref().ok(),
        "deterministic"
    );

    // The entry the docs point at, and every address it could be read as.
    let lines = |name: &str| -> Vec<&str> {
        req.headers()
            .get_all(name)
            .iter()
            .filter_map(|v| v.to_str().ok())
            .collect()
    };
    let entry: Option<&str> = if trusted == 0 {
        None
    } else {
        match via {
            ProxyHeader::XForwardedFor => {
                let list: Vec<&str> = lines("x-forwarded-for")
                    .into_iter()
                    .flat_map(|v| v.split(','))
                    .map(str::trim)
                    .collect();
                list.len().checked_sub(trusted).map(|i| list[i])
            }
            ProxyHeader::Forwarded => {
                let list: Vec<&str> = lines("forwarded")
                    .into_iter()
                    .flat_map(|v| v.split(','))
                    .filter_map(forwarded_for)
                    .collect();
                list.len().checked_sub(trusted).map(|i| list[i])
            }
            _ => {
                let all = req.headers().get_all("x-real-ip").iter().count();
                let values = lines("x-real-ip");
                (trusted == 1 && all == 1 && values.len() == 1).then(|| values[0].trim())
            }
        }
    };
    let peer_key = peer.map(|ip| keyed(ip, prefix));
    let strict = entry.and_then(strict_ip).map(|ip| keyed(ip, prefix));

    let Ok(text) = got else {
        assert!(
            peer.is_none() && strict.is_none(),
            "no key, though peer {peer:?} and entry {entry:?}"
        );
        return;
    };
    let ip: IpAddr = text.parse().expect("the key is an address");
    if let Some(expected) = strict {
        assert_eq!(
            ip, expected,
            "the trusted entry {entry:?} gives another key"
        );
    } else if Some(ip) != peer_key {
        // Read from the entry by a looser reading than the docs' forms: the
        // address must still be written in it.
        let entry = entry.unwrap_or_else(|| panic!("key {ip} from nowhere (peer {peer:?})"));
        let written = entry
            .split(['[', ']', '"'])
            .flat_map(|s| [s, s.rsplit_once(':').map_or(s, |(h, _)| h)])
            // An IPv6 zone (`%eth0`) names no other address.
            .map(|s| s.split_once('%').map_or(s, |(ip, _)| ip))
            .filter_map(|s| s.parse::<IpAddr>().ok())
            .any(|seen| keyed(seen, prefix) == ip);
        assert!(written, "key {ip} is not written in entry {entry:?}");
    }
    if let IpAddr::V6(v6) = ip {
        let bits = u32::from(prefix.min(128));
        let host_bits = u128::from(v6) & u128::MAX.checked_shr(bits).unwrap_or(0);
        assert_eq!(host_bits, 0, "IPv6 key {ip} not cut to /{bits}");
        assert!(v6.to_ipv4_mapped().is_none(), "a mapped IPv4 key {ip}");
    }
    let shown = key_label(&key, &req).expect("a key has a label");
    assert_eq!(
        shown,
        fingerprint(&text).to_string(),
        "an address is shown only as its fingerprint"
    );
    let raw = key_label(&key.show_raw(), &req).expect("a key has a label");
    assert_eq!(raw, text);
}
