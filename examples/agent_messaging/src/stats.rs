//! What `GET /stats` counts: messages delivered, and refused by reason.

use std::sync::atomic::{AtomicU64, Ordering};

use serde_json::json;

/// Why a message was not delivered.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Refusal {
    /// Not a message: 400.
    Malformed,
    /// No node's key: 401.
    Unauthorized,
    /// `from` is not the node whose key was presented: 403.
    NotTheSender,
    Unaddressable,
    SelfSend,
    CrossProject,
    FanOut,
    Pair,
    /// The receiver's inbox was full: 409.
    Busy,
}

impl Refusal {
    const ALL: [Refusal; 9] = [
        Refusal::Malformed,
        Refusal::Unauthorized,
        Refusal::NotTheSender,
        Refusal::Unaddressable,
        Refusal::SelfSend,
        Refusal::CrossProject,
        Refusal::FanOut,
        Refusal::Pair,
        Refusal::Busy,
    ];

    /// The reason as answers and stats name it.
    pub fn as_str(self) -> &'static str {
        match self {
            Refusal::Malformed => "bad_request",
            Refusal::Unauthorized => "unauthorized",
            Refusal::NotTheSender => "not-the-sender",
            Refusal::Unaddressable => "unaddressable-node-id",
            Refusal::SelfSend => "self-send",
            Refusal::CrossProject => "cross-project",
            Refusal::FanOut => "fan_out",
            Refusal::Pair => "pair",
            Refusal::Busy => "target_busy",
        }
    }
}

/// The counters, since the service started.
#[derive(Debug, Default)]
pub struct Counters {
    delivered: AtomicU64,
    refused: [AtomicU64; Refusal::ALL.len()],
}

impl Counters {
    pub fn delivered(&self) {
        self.delivered.fetch_add(1, Ordering::Relaxed);
    }

    pub fn refused(&self, why: Refusal) {
        self.refused[why as usize].fetch_add(1, Ordering::Relaxed);
    }

    /// `{"delivered": n, "refused": {reason: n, ...}}`.
    pub fn snapshot(&self) -> serde_json::Value {
        let refused: serde_json::Map<String, serde_json::Value> = Refusal::ALL
            .iter()
            .map(|&why| {
                let n = self.refused[why as usize].load(Ordering::Relaxed);
                (why.as_str().to_owned(), json!(n))
            })
            .collect();
        json!({
            "delivered": self.delivered.load(Ordering::Relaxed),
            "refused": refused,
        })
    }
}
