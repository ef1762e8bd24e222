//! Where a layer's handles find the state its services use, so that a handle
//! taken at any point of the builder controls what the built services use.
//!
//! Some builder methods build a layer's state afresh (a limiter with another
//! quota, clock or per-key counting). The state lives in an `Arc` the
//! services share; handles reach it through a cell, the layer's [`Home`],
//! which the builder updates. While no clone of the layer and no service
//! made by it exists, the state is replaced in the cell itself, and every
//! handle taken so far follows. Once the state is shared, a rebuild cannot
//! change what the clones and services already hold: the rebuilt layer then
//! gets a cell of its own, and handles taken before stay with the state the
//! others use, which is still theirs.

use std::fmt;
use std::sync::Arc;

use arc_swap::ArcSwap;

/// What a handle holds: the cell its layer's state is found in.
pub(crate) type Cell<T> = Arc<ArcSwap<T>>;

/// A layer's cell, and a count of who uses the state in it.
pub(crate) struct Home<T> {
    cell: Cell<T>,
    /// One per layer (clones included) and per set of services made by one
    /// `layer` call. Handles are not counted: they follow.
    users: Arc<()>,
}

impl<T> Home<T> {
    /// A home for `state`.
    pub(crate) fn new(state: &Arc<T>) -> Self {
        Self {
            cell: Arc::new(ArcSwap::new(state.clone())),
            users: Arc::new(()),
        }
    }

    /// `next` replaces the state: in the same cell while this layer alone
    /// uses it (no other user can appear meanwhile: a new one is only made
    /// from an existing one, and this layer is owned by its caller), else
    /// in a cell of its own.
    pub(crate) fn replace(&mut self, next: &Arc<T>) {
        if Arc::strong_count(&self.users) == 1 {
            self.cell.store(next.clone());
        } else {
            // Handles taken so far keep controlling the clones and services
            // made before; say so once, as a builder called after the
            // layer was used is rarely meant.
            if Arc::strong_count(&self.cell) > Arc::strong_count(&self.users) {
                tracing::warn!(
                    "a layer was rebuilt after it was cloned or used: handles taken before \
                     control the earlier services, not the rebuilt layer's; take handles \
                     after the last builder call"
                );
            }
            *self = Self::new(next);
        }
    }

    /// The cell, for a handle.
    pub(crate) fn cell(&self) -> Cell<T> {
        self.cell.clone()
    }
}

impl<T> Clone for Home<T> {
    /// Another user of the same state.
    fn clone(&self) -> Self {
        Self {
            cell: self.cell.clone(),
            users: self.users.clone(),
        }
    }
}

impl<T> fmt::Debug for Home<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Home")
            .field("users", &Arc::strong_count(&self.users))
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_replacement_stays_in_the_cell_until_the_state_is_shared() {
        let first = Arc::new(1);
        let mut home = Home::new(&first);
        let early = home.cell();
        home.replace(&Arc::new(2));
        assert_eq!(**early.load(), 2, "a handle taken before follows");
        let other = home.clone();
        home.replace(&Arc::new(3));
        assert_eq!(**early.load(), 2, "the other user's state is kept");
        assert_eq!(**home.cell().load(), 3);
        assert_eq!(**other.cell().load(), 2);
    }
}
