//! The `reqwest_client` example's two waves against its own local upstream.
#![cfg(feature = "reqwest")]

mod support;

#[path = "../examples/reqwest_client.rs"]
mod reqwest_client;

use reqwest_client::Outcome;

#[tokio::test]
async fn the_burst_shows_waits_refusals_and_a_cooldown() {
    let (url, server) = reqwest_client::start_upstream().await.unwrap();
    let outcomes = reqwest_client::run(&url, &["small", "big"], 8)
        .await
        .unwrap();
    let of = |wave: u8, model: &str| -> Vec<Outcome> {
        outcomes
            .iter()
            .filter(|(w, m, _)| *w == wave && m == model)
            .map(|(_, _, o)| o.clone())
            .collect()
    };
    let count = |outcomes: &[Outcome], wanted: &dyn Fn(&Outcome) -> bool| {
        outcomes.iter().filter(|o| wanted(o)).count()
    };
    let small = of(1, "small");
    // 3 a second, evenly spaced, waiting at most 400 ms: some go, some would
    // wait too long.
    assert!(
        count(&small, &|o| matches!(o, Outcome::Answered(200, _))) >= 2,
        "{small:?}"
    );
    assert!(
        count(&small, &|o| *o == Outcome::Refused("rate_limited")) >= 1,
        "{small:?}"
    );
    assert_eq!(
        count(&small, &|o| matches!(o, Outcome::Answered(429, _))),
        0,
        "{small:?}"
    );
    // `big`: the upstream takes 1 a second, so the second gets a 429 and the
    // route cools down: the next wave is refused before it leaves.
    let big = of(1, "big");
    assert!(
        big.iter().any(|o| matches!(o, Outcome::Answered(429, _))),
        "{big:?}"
    );
    let again = of(2, "big");
    assert!(
        again.iter().all(|o| *o == Outcome::Refused("cooling_down")),
        "{again:?}"
    );
    server.abort();
}
