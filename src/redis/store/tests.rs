//! The Redis store's unit tests: a key's states in one Cluster hash slot, and prefixes with braces refused.

use super::*;

/// Redis Cluster's slot of a key name: CRC16 (XMODEM) of its hash tag
/// (the first non-empty `{...}`), or of the whole name, mod 16384.
/// Written out here, as the cluster computes it, to check the names.
fn slot(name: &str) -> u16 {
    let bytes = name.as_bytes();
    let tagged = bytes.iter().position(|&b| b == b'{').and_then(|open| {
        let len = bytes[open + 1..].iter().position(|&b| b == b'}')?;
        (len > 0).then(|| &bytes[open + 1..open + 1 + len])
    });
    let mut crc: u16 = 0;
    for &byte in tagged.unwrap_or(bytes) {
        crc ^= u16::from(byte) << 8;
        for _ in 0..8 {
            crc = if crc & 0x8000 != 0 {
                (crc << 1) ^ 0x1021
            } else {
                crc << 1
            };
        }
    }
    crc % 16384
}

#[test]
fn the_crc16_is_the_clusters() {
    // Values from the Redis Cluster specification.
    assert_eq!(slot("123456789"), 0x31C3);
    assert_eq!(slot("{user1000}.following"), slot("{user1000}.followers"));
}

#[test]
fn every_state_of_a_key_is_in_one_slot_and_keys_spread() {
    let store = RedisStore::new("redis://127.0.0.1:1")
        .unwrap()
        .with_prefix("app:chat:")
        .unwrap();
    let mut slots = std::collections::HashSet::new();
    for k in 0..64 {
        let parts = [format!("client-{k}")];
        let base = store.names.base(&store.prefix, &parts);
        let names = [
            format!("{base}:rl:r"),
            format!("{base}:rl:tag:0g"),
            format!("{base}:rl:tag:1w"),
            format!("{base}:cd"),
        ];
        let first = slot(&names[0]);
        assert!(names.iter().all(|n| slot(n) == first), "{names:?}");
        slots.insert(first);
    }
    assert!(slots.len() > 32, "keys crowd into {} slots", slots.len());
}

#[test]
fn a_prefix_with_a_brace_is_refused() {
    for prefix in ["app{}:", "{tenant}:", "a}b:", "x{"] {
        let store = RedisStore::new("redis://127.0.0.1:1").unwrap();
        let err = store.with_prefix(prefix).unwrap_err().to_string();
        assert!(err.contains("brace"), "{prefix}: {err}");
    }
}
