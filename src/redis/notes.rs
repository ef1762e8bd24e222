//! Notes on a board every replica sharing a store reads: what one replica
//! learned that the others should act on before they learn it themselves
//! (the example gateway shares the limits its providers state this way).
//!
//! A board is one Redis hash, `prefix{hash of the board's name}:notes`:
//! each note under a keyed hash of its name (never the name's text), with
//! when it was put and when it expires, on Redis's clock, so replicas with
//! skewed clocks agree on which note is newer. The board expires with its
//! longest-lived note; an expired note is dropped by the next read. A
//! board holds at most [`RedisStore::MOST_NOTES`] live notes.

use std::sync::LazyLock;
use std::time::Duration;

use ::redis::Script;

use super::{RedisStore, StoreError};
use crate::error::{BoxError, StoreCallFailed};

static PUT: LazyLock<Script> = LazyLock::new(|| Script::new(include_str!("note_put.lua")));
static READ: LazyLock<Script> = LazyLock::new(|| Script::new(include_str!("note_read.lua")));

/// A note as [`RedisStore::notes`] reads it.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct Note {
    /// When it was put, in microseconds since the Unix epoch on Redis's
    /// clock: of two notes, the one put later is the newer, whichever
    /// replica put it.
    pub put_micros: u64,
    /// The text, as put.
    pub text: String,
}

impl RedisStore {
    /// The most live notes one board holds.
    pub const MOST_NOTES: usize = 4096;

    /// The longest note's text, in bytes.
    pub const MOST_NOTE_BYTES: usize = 4096;

    /// Put `text` on `board` under `name` for `ttl` (at least a
    /// millisecond), in place of the note of that name; every replica on
    /// this store reads it with [`notes`](Self::notes).
    ///
    /// `name` is stored as a keyed hash (see
    /// [`with_hash_key`](Self::with_hash_key)); `text` is stored as given,
    /// so it must hold nothing secret. A text over
    /// [`MOST_NOTE_BYTES`](Self::MOST_NOTE_BYTES), a full board, Redis not
    /// answering within the store's timeout, or its breaker open is a
    /// [`StoreCallFailed`].
    pub async fn put_note(
        &self,
        board: &str,
        name: &str,
        text: &str,
        ttl: Duration,
    ) -> Result<(), BoxError> {
        if text.len() > Self::MOST_NOTE_BYTES {
            return Err(StoreCallFailed::new("put_note", "the note is too long").into());
        }
        let micros = u64::try_from(ttl.as_micros())
            .unwrap_or(u64::MAX)
            // 2^53: exact in Lua's numbers, and far past any use.
            .clamp(1_000, 1 << 53);
        let keys = [board_key(self, board)];
        let field: String = self
            .names
            .hash(&[name])
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect();
        let args = [
            field,
            text.to_owned(),
            micros.to_string(),
            self.now_arg(),
            Self::MOST_NOTES.to_string(),
        ];
        let put: i64 = self
            .run("notes", &PUT, &keys, &args)
            .await
            .map_err(|e| failed("put_note", &e))?;
        if put == 1 {
            Ok(())
        } else {
            Err(StoreCallFailed::new("put_note", "the board is full").into())
        }
    }

    /// Every live note on `board`, in no particular order.
    pub async fn notes(&self, board: &str) -> Result<Vec<Note>, BoxError> {
        let keys = [board_key(self, board)];
        let args = [self.now_arg()];
        let flat: Vec<String> = self
            .run("notes", &READ, &keys, &args)
            .await
            .map_err(|e| failed("notes", &e))?;
        let mut notes = Vec::with_capacity(flat.len() / 2);
        for pair in flat.chunks(2) {
            let [put, text] = pair else {
                self.bad_reply("notes");
                return Err(failed("notes", &StoreError::Reply).into());
            };
            let Ok(put_micros) = put.parse() else {
                self.bad_reply("notes");
                return Err(failed("notes", &StoreError::Reply).into());
            };
            notes.push(Note {
                put_micros,
                text: text.clone(),
            });
        }
        Ok(notes)
    }
}

/// The Redis key of `board`.
fn board_key(store: &RedisStore, board: &str) -> String {
    let mut name = store.names.base(&store.prefix, &["notes", board]);
    name.push_str(":notes");
    name
}

fn failed(what: &'static str, e: &StoreError) -> StoreCallFailed {
    StoreCallFailed::new(what, e.to_string())
}
