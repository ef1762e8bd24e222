//! Key extraction: built-in extractors, tuples, closures, and key text.

#![cfg(feature = "test-util")]

mod support;

use std::net::{IpAddr, Ipv4Addr};

use support::Inner;
use tower::{Layer, Service, ServiceExt};
use tower_throttle::error::{BoxError, RateLimited};
use tower_throttle::key::{
    ClientIpKey, ExtensionKey, GlobalKey, HeaderKey, HostKey, JsonFieldKey, KeyPart, PathPrefixKey,
    ProxyHeader, key_text,
};
use tower_throttle::rate_limit::{Quota, RateLimitLayer};

fn one_per_minute() -> Quota {
    Quota::per_minute(1).unwrap()
}

fn pair(from: &str, to: &str) -> http::Request<()> {
    http::Request::builder()
        .header("x-from", from)
        .header("x-to", to)
        .body(())
        .unwrap()
}

async fn admitted<S>(svc: &mut S, req: http::Request<()>) -> bool
where
    S: Service<http::Request<()>, Response = http::Response<()>, Error = BoxError>,
{
    match svc.ready().await.unwrap().call(req).await {
        Ok(_) => true,
        Err(err) if err.is::<RateLimited>() => false,
        Err(err) => panic!("unexpected error: {err}"),
    }
}

#[tokio::test(start_paused = true)]
async fn a_to_b_is_independent_of_a_to_c_and_b_to_a() {
    let key = (
        HeaderKey::new("x-from").unwrap(),
        HeaderKey::new("x-to").unwrap(),
    );
    let mut svc = RateLimitLayer::new(one_per_minute(), key).layer(Inner::new());
    assert!(admitted(&mut svc, pair("A", "B")).await);
    assert!(
        !admitted(&mut svc, pair("A", "B")).await,
        "A→B is throttled"
    );
    assert!(
        admitted(&mut svc, pair("A", "C")).await,
        "A→C is its own key"
    );
    assert!(
        admitted(&mut svc, pair("B", "A")).await,
        "B→A is its own key"
    );
}

#[tokio::test(start_paused = true)]
async fn tuple_parts_that_join_to_the_same_text_are_distinct_keys() {
    let key = (
        HeaderKey::new("x-from").unwrap(),
        HeaderKey::new("x-to").unwrap(),
    );
    let mut svc = RateLimitLayer::new(one_per_minute(), key).layer(Inner::new());
    assert!(admitted(&mut svc, pair("ab", "c")).await);
    assert!(
        admitted(&mut svc, pair("a", "bc")).await,
        "ab+c and a+bc collided"
    );
    assert!(admitted(&mut svc, pair("a/b", "c")).await);
    assert!(
        admitted(&mut svc, pair("a", "b/c")).await,
        "a/b+c and a+b/c collided"
    );
    assert!(!admitted(&mut svc, pair("ab", "c")).await);
}

#[test]
fn key_text_joins_parts_and_names_the_global_key() {
    let req = http::Request::builder()
        .uri("https://API.Example.com/openai/v1/chat?q=1")
        .header("x-model", "gpt-4o")
        .body(())
        .unwrap();
    let route = (
        HostKey,
        PathPrefixKey::segments(1).unwrap(),
        HeaderKey::new("x-model").unwrap(),
    );
    assert_eq!(
        key_text(&route, &req).unwrap(),
        "api.example.com//openai/gpt-4o"
    );
    assert_eq!(key_text(&GlobalKey, &req).unwrap(), "(global)");
    assert_eq!(
        key_text(&PathPrefixKey::segments(2).unwrap(), &req).unwrap(),
        "/openai/v1"
    );
    assert_eq!(
        key_text(&PathPrefixKey::segments(9).unwrap(), &req).unwrap(),
        "/openai/v1/chat"
    );
    assert!(PathPrefixKey::segments(0).is_err());
    assert!(HeaderKey::new("bad header").is_err());
    let missing = key_text(&HeaderKey::new("x-absent").unwrap(), &req).unwrap_err();
    assert!(missing.to_string().contains("x-absent"), "{missing}");
}

#[test]
fn host_comes_from_the_host_header_when_the_uri_has_none() {
    let req = http::Request::builder()
        .uri("/v1/chat")
        .header("host", "Gateway.local:8080")
        .body(())
        .unwrap();
    assert_eq!(key_text(&HostKey, &req).unwrap(), "gateway.local");
    let v6 = http::Request::builder()
        .uri("/")
        .header("host", "[::1]")
        .body(())
        .unwrap();
    assert_eq!(key_text(&HostKey, &v6).unwrap(), "[::1]");
}

#[test]
fn extension_and_closure_extractors() {
    let mut req = http::Request::builder().body(()).unwrap();
    req.extensions_mut()
        .insert(IpAddr::V4(Ipv4Addr::new(10, 0, 0, 7)));
    assert_eq!(
        key_text(&ExtensionKey::<IpAddr>::new(), &req).unwrap(),
        "10.0.0.7"
    );
    assert!(key_text(&ExtensionKey::<u64>::new(), &req).is_err());

    let by_method = |req: &http::Request<()>| Some(req.method().as_str().to_owned());
    assert_eq!(key_text(&by_method, &req).unwrap(), "GET");
    let nothing = |_req: &http::Request<()>| None::<u64>;
    assert!(key_text(&nothing, &req).is_err());
}

#[test]
fn integer_parts_are_keyed_by_their_decimal_text() {
    fn text<T: KeyPart + Copy + Send + Sync + 'static>(value: T) -> String {
        key_text(&move |_: &()| Some(value), &()).expect("a key")
    }
    assert_eq!(text(-42i64), "-42");
    assert_eq!(text(0u8), "0");
    assert_eq!(text(i64::MIN), "-9223372036854775808");
    assert_eq!(text(u128::MAX), "340282366920938463463374607431768211455");
}

#[test]
fn json_field_reads_strings_numbers_and_booleans_only() {
    let key = JsonFieldKey::new("model");
    let text = |body: &'static str| key_text(&key, &http::Request::new(body));
    assert_eq!(text(r#"{"model":"gpt-4o"}"#).unwrap(), "gpt-4o");
    assert_eq!(text(r#"{"model":"g\"pt"}"#).unwrap(), "g\"pt");
    assert_eq!(text(r#"{"model":7}"#).unwrap(), "7");
    assert_eq!(text(r#"{"model":true}"#).unwrap(), "true");
    assert_eq!(
        text(r#"{"a":{"model":"inner"},"model":"outer"}"#).unwrap(),
        "outer"
    );
    for bad in [
        r#"{"model":{"x":1}}"#,
        r#"{"model":[1]}"#,
        r#"["model"]"#,
        r#"{"model":"x""#,
        "",
    ] {
        assert!(text(bad).is_err(), "{bad}");
    }
}

/// Counts the requests that reach it; stands in for any service the layer
/// may wrap, here one over plain numbers.
fn numbers_service() -> impl Service<u64, Response = (), Error = std::convert::Infallible> + Clone {
    tower::service_fn(|_n: u64| std::future::ready(Ok(())))
}

#[tokio::test(start_paused = true)]
async fn any_request_type_works_with_a_closure_key() {
    let key = |n: &u64| Some(*n % 2);
    let mut svc = RateLimitLayer::new(one_per_minute(), key).layer(numbers_service());
    svc.ready().await.unwrap().call(1).await.unwrap();
    svc.ready().await.unwrap().call(2).await.unwrap();
    let err = svc.ready().await.unwrap().call(3).await.unwrap_err();
    assert_eq!(err.downcast_ref::<RateLimited>().unwrap().key, "1");
}

#[test]
fn trusted_proxies_are_read_from_their_one_header_and_a_client_cannot_add_another() {
    let req = |headers: &[(&str, &str)]| {
        let mut builder = http::Request::builder();
        for (name, value) in headers {
            builder = builder.header(*name, *value);
        }
        let mut req = builder.body(()).unwrap();
        req.extensions_mut()
            .insert("10.0.0.2:5555".parse::<std::net::SocketAddr>().unwrap());
        req
    };
    let xff = ClientIpKey::new().trust_proxies(1);
    let forwarded = ClientIpKey::new()
        .trust_proxies(1)
        .via(ProxyHeader::Forwarded);
    // The proxy writes `Forwarded`; the client adds `X-Forwarded-For`.
    let spoofed = req(&[
        ("forwarded", "for=198.51.100.7"),
        ("x-forwarded-for", "6.6.6.6"),
        ("x-real-ip", "7.7.7.7"),
    ]);
    assert_eq!(key_text(&forwarded, &spoofed).unwrap(), "198.51.100.7");
    // The proxy writes `X-Forwarded-For`; the client adds `Forwarded` and
    // `X-Real-IP`, which are never read.
    let spoofed = req(&[
        ("x-forwarded-for", "198.51.100.7"),
        ("forwarded", "for=6.6.6.6"),
        ("x-real-ip", "7.7.7.7"),
    ]);
    assert_eq!(key_text(&xff, &spoofed).unwrap(), "198.51.100.7");
    // A hop that did not append: the peer, never a client's header.
    let short = req(&[("forwarded", "for=6.6.6.6"), ("x-real-ip", "7.7.7.7")]);
    assert_eq!(key_text(&xff, &short).unwrap(), "10.0.0.2");
    let real_ip = ClientIpKey::new()
        .trust_proxies(1)
        .via(ProxyHeader::XRealIp);
    assert_eq!(
        key_text(&real_ip, &req(&[("x-real-ip", "198.51.100.7")])).unwrap(),
        "198.51.100.7"
    );
    let twice = req(&[("x-real-ip", "6.6.6.6"), ("x-real-ip", "198.51.100.7")]);
    assert_eq!(key_text(&real_ip, &twice).unwrap(), "10.0.0.2");
}

#[test]
fn ipv6_clients_are_keyed_by_their_subnet_and_mapped_ipv4_as_ipv4() {
    let from = |peer: &str| {
        let mut req = http::Request::new(());
        req.extensions_mut()
            .insert(peer.parse::<std::net::IpAddr>().unwrap());
        req
    };
    let key = ClientIpKey::new();
    let a = key_text(&key, &from("2001:db8:1:2:aaaa::1")).unwrap();
    let b = key_text(&key, &from("2001:db8:1:2:bbbb::9")).unwrap();
    let other = key_text(&key, &from("2001:db8:1:3::1")).unwrap();
    assert_eq!(a, b, "one /64, one key");
    assert_ne!(a, other);
    let each = ClientIpKey::new().ipv6_prefix(128);
    assert_ne!(
        key_text(&each, &from("2001:db8:1:2:aaaa::1")).unwrap(),
        key_text(&each, &from("2001:db8:1:2:bbbb::9")).unwrap()
    );
    assert_eq!(
        key_text(&key, &from("::ffff:203.0.113.9")).unwrap(),
        key_text(&key, &from("203.0.113.9")).unwrap()
    );
}
