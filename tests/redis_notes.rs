//! `RedisStore::put_note` and `notes`: what one replica puts on a board,
//! every replica on the same Redis reads; the newest note of a name wins;
//! notes expire on Redis's clock; names never reach Redis as text; a board
//! is bounded.

#![cfg(feature = "redis")]

use testkit::redis as redis_server;

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use redis_server::RedisServer;
use tower_throttle::error::StoreCallFailed;
use tower_throttle::redis::RedisStore;

/// The scripts' clock, moved by hand (microseconds since the epoch).
fn clock() -> Arc<AtomicU64> {
    let now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .expect("after 1970")
        .as_micros() as u64;
    Arc::new(AtomicU64::new(now))
}

fn store(server: &RedisServer, clock: &Arc<AtomicU64>) -> RedisStore {
    RedisStore::new(&server.url())
        .unwrap()
        .with_prefix("notes-test:")
        .unwrap()
        .with_timeout(Duration::from_secs(2))
        .with_test_clock(clock.clone())
}

fn texts(notes: &[tower_throttle::redis::Note]) -> Vec<&str> {
    let mut texts: Vec<&str> = notes.iter().map(|n| n.text.as_str()).collect();
    texts.sort_unstable();
    texts
}

const HOUR: Duration = Duration::from_secs(3600);

#[tokio::test]
async fn a_note_one_replica_puts_the_other_reads_and_the_newest_wins() {
    let Some(server) = RedisServer::start("a_note_one_replica_puts") else {
        return;
    };
    let clock = clock();
    let (a, b) = (store(&server, &clock), store(&server, &clock));
    assert!(b.notes("learned").await.unwrap().is_empty());
    a.put_note("learned", "openai/gpt-4o", "limit 5", HOUR)
        .await
        .unwrap();
    let first = b.notes("learned").await.unwrap();
    assert_eq!(texts(&first), ["limit 5"]);
    assert_eq!(first[0].put_micros, clock.load(Ordering::SeqCst));

    clock.fetch_add(1_000, Ordering::SeqCst);
    b.put_note("learned", "openai/gpt-4o", "limit 7", HOUR)
        .await
        .unwrap();
    a.put_note(
        "learned",
        "openai/o3",
        "limit 1\nline two: \"quoted\"",
        HOUR,
    )
    .await
    .unwrap();
    let both = a.notes("learned").await.unwrap();
    assert_eq!(texts(&both), ["limit 1\nline two: \"quoted\"", "limit 7"]);
    let newer = both.iter().find(|n| n.text == "limit 7").unwrap();
    assert_eq!(newer.put_micros, first[0].put_micros + 1_000);
    assert!(a.notes("other board").await.unwrap().is_empty());
}

#[tokio::test]
async fn notes_expire_on_the_store_clock_and_names_stay_hashed() {
    let Some(server) = RedisServer::start("notes_expire") else {
        return;
    };
    let clock = clock();
    let store = store(&server, &clock);
    store
        .put_note(
            "learned",
            "secret-model-name",
            "short",
            Duration::from_secs(1),
        )
        .await
        .unwrap();
    store
        .put_note("learned", "another", "long", HOUR)
        .await
        .unwrap();
    let mut conn = server.connection();
    let keys: Vec<String> = redis::cmd("KEYS").arg("*").query(&mut conn).unwrap();
    assert_eq!(keys.len(), 1, "{keys:?}");
    assert!(keys[0].starts_with("notes-test:{"), "{keys:?}");
    let fields: Vec<String> = redis::cmd("HKEYS").arg(&keys[0]).query(&mut conn).unwrap();
    assert_eq!(fields.len(), 2);
    for text in keys.iter().chain(&fields) {
        assert!(
            !text.contains("secret") && !text.contains("learned"),
            "{text}"
        );
    }
    let ttl: i64 = redis::cmd("PTTL").arg(&keys[0]).query(&mut conn).unwrap();
    assert!(
        ttl > 3_500_000,
        "the board lives as long as its longest note: {ttl}"
    );

    clock.fetch_add(999_999, Ordering::SeqCst);
    assert_eq!(
        texts(&store.notes("learned").await.unwrap()),
        ["long", "short"]
    );
    clock.fetch_add(1, Ordering::SeqCst);
    assert_eq!(texts(&store.notes("learned").await.unwrap()), ["long"]);
    let fields: i64 = redis::cmd("HLEN").arg(&keys[0]).query(&mut conn).unwrap();
    assert_eq!(fields, 1, "the expired note was dropped");
}

#[tokio::test]
async fn a_board_is_bounded_and_a_long_note_refused() {
    let Some(server) = RedisServer::start("a_board_is_bounded") else {
        return;
    };
    let clock = clock();
    let store = store(&server, &clock);
    let refused = |e: tower_throttle::error::BoxError| {
        e.downcast::<StoreCallFailed>()
            .map(|e| e.reason)
            .unwrap_or_else(|e| panic!("{e}"))
    };
    let long = "x".repeat(RedisStore::MOST_NOTE_BYTES + 1);
    let e = store.put_note("b", "n", &long, HOUR).await.unwrap_err();
    assert_eq!(refused(e), "the note is too long");

    for i in 0..RedisStore::MOST_NOTES {
        let ttl = if i == 0 { Duration::from_secs(1) } else { HOUR };
        store.put_note("b", &i.to_string(), "x", ttl).await.unwrap();
    }
    let e = store
        .put_note("b", "one more", "x", HOUR)
        .await
        .unwrap_err();
    assert_eq!(refused(e), "the board is full");
    // A note already there can still be replaced.
    store.put_note("b", "7", "y", HOUR).await.unwrap();
    // Room is made from expired notes only.
    clock.fetch_add(1_000_000, Ordering::SeqCst);
    store.put_note("b", "one more", "x", HOUR).await.unwrap();
    assert_eq!(
        store.notes("b").await.unwrap().len(),
        RedisStore::MOST_NOTES
    );
}
