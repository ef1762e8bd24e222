//! One key's waiters, and the order in which they get their permits.
//!
//! Every waiter is in a *lane*. Without fair share there is one lane, and
//! the order is arrival order. With fair share (a lane per caller, say),
//! the lanes with waiters take turns: each permit goes to the oldest waiter
//! of the lane whose turn it is, and that lane, if it still has waiters,
//! goes to the back of the round. A lane that starts waiting joins the back
//! too, but ahead of the lane that got the last permit when that one is at
//! the back (it just had its turn), so its first waiter gets a permit
//! within one round (one turn per lane ahead of it), however many the
//! other lanes have waiting; and each lane's own waiters go in their
//! arrival order.
//!
//! A lane of weight `w` (its newest waiter's, see
//! [`KeyBuilder::set_weight`](crate::key::KeyBuilder::set_weight)) takes
//! up to `w` permits in a row when its turn comes, so under load it gets
//! `w` shares of the key to a weight-1 lane's one. A lane that starts
//! waiting while the last served lane is in the middle of such a turn
//! goes behind it (cutting in would cost that lane its share against
//! callers that send one request at a time); it still waits at most one
//! turn of each lane ahead of it.
//!
//! When the key's line is full, a newcomer may push out the newest waiter
//! of the longest lane (see [`Waiters::push_out_for`]): a flood fills its
//! own lane, never the others' room.

use std::collections::{HashMap, VecDeque};
use std::hash::BuildHasherDefault;
use std::task::Waker;

use crate::store::PassThrough;

/// One waiting request.
pub(super) struct Waiter {
    pub(super) ticket: u64,
    pub(super) lane: u64,
    /// Its lane's weight: permits in a row per turn (at least 1).
    pub(super) weight: u32,
    /// The task to wake when the permit comes; `None` until first polled.
    pub(super) waker: Option<Waker>,
}

/// A key's waiters, oldest first, and the round of their lanes.
#[derive(Default)]
pub(super) struct Waiters {
    /// Oldest first; tickets strictly rising (so a binary search finds one).
    all: VecDeque<Waiter>,
    /// The lanes with waiters, the one whose turn is next first.
    round: VecDeque<u64>,
    /// Each lane of `round`. Lanes are keyed hashes already: hashed
    /// again, they would only cost.
    per_lane: HashMap<u64, Lane, BuildHasherDefault<PassThrough>>,
    /// The weights of the lanes in `round`, summed.
    total_weight: u64,
}

/// A lane with waiters.
struct Lane {
    waiting: usize,
    weight: u32,
    /// Permits it took in its current turn (it is at the front).
    served: u32,
}

impl Waiters {
    pub(super) fn len(&self) -> usize {
        self.all.len()
    }

    pub(super) fn is_empty(&self) -> bool {
        self.all.is_empty()
    }

    fn position(&self, ticket: u64) -> Option<usize> {
        self.all.binary_search_by_key(&ticket, |w| w.ticket).ok()
    }

    /// The waiter holding `ticket`, if it still waits.
    pub(super) fn get_mut(&mut self, ticket: u64) -> Option<&mut Waiter> {
        let i = self.position(ticket)?;
        self.all.get_mut(i)
    }

    /// Add a waiter, its ticket above every other's; `last` is the lane
    /// that got the last permit.
    pub(super) fn push(&mut self, waiter: Waiter, last: u64) {
        let weight = waiter.weight.max(1);
        if !self.per_lane.contains_key(&waiter.lane) {
            // Not ahead of a lane in the middle of its turn (it is at the
            // front, taking its weight's permits): behind it, so a heavy
            // lane keeps its share against callers that send one at a time.
            let mid_turn = |lane: &u64| self.per_lane.get(lane).is_some_and(|l| l.served > 0);
            match self.round.back() {
                Some(&back) if back == last && back != waiter.lane && !mid_turn(&back) => {
                    self.round.insert(self.round.len() - 1, waiter.lane);
                }
                _ => self.round.push_back(waiter.lane),
            }
        }
        let lane = self.per_lane.entry(waiter.lane).or_insert(Lane {
            waiting: 0,
            weight: 0,
            served: 0,
        });
        lane.waiting += 1;
        // The newest waiter's weight is the lane's.
        self.total_weight = self.total_weight - u64::from(lane.weight) + u64::from(weight);
        lane.weight = weight;
        self.all.push_back(waiter);
    }

    /// The most permits that can go before a newcomer of weight `weight`
    /// in `lane`, its own included, as the lanes now waiting take their
    /// turns: its place in its lane, and for each of its lane's turns up
    /// to it, one turn of every other lane. With weights of 1: its place
    /// times the lanes waiting.
    pub(super) fn turns_for(&self, lane: u64, weight: u32) -> u64 {
        let (mine, my_weight) = self
            .per_lane
            .get(&lane)
            .map_or((0, 0), |l| (l.waiting, l.weight));
        let place = mine as u64 + 1;
        let others = self.total_weight - u64::from(my_weight);
        let rounds = place.div_ceil(u64::from(weight.max(1)));
        place.saturating_add(rounds.saturating_mul(others))
    }

    /// Take out the waiter whose turn it is.
    pub(super) fn pop_next(&mut self) -> Option<Waiter> {
        let lane = *self.round.front()?;
        // One lane: its oldest waiter is the oldest of all.
        let i = if self.round.len() == 1 {
            0
        } else {
            self.all.iter().position(|w| w.lane == lane)?
        };
        let waiter = self.all.remove(i)?;
        if let Some(state) = self.per_lane.get_mut(&lane) {
            state.served += 1;
            // Its turn goes on while it has waiters and weight left.
            if state.served < state.weight && state.waiting > 1 {
                self.count_out(lane);
                return Some(waiter);
            }
            state.served = 0;
        }
        self.round.pop_front();
        if self.count_out(lane) > 0 {
            self.round.push_back(lane);
        }
        Some(waiter)
    }

    /// Take out the waiter holding `ticket`, if it still waits.
    pub(super) fn remove(&mut self, ticket: u64) -> Option<Waiter> {
        let waiter = self.all.remove(self.position(ticket)?)?;
        if self.count_out(waiter.lane) == 0 {
            self.round.retain(|&lane| lane != waiter.lane);
        }
        Some(waiter)
    }

    /// Make room for a newcomer in `lane` in a full line: take out the
    /// newest waiter of the longest lane, when that lane would still be
    /// longer than `lane` with the newcomer in it. `None`: the newcomer's
    /// own lane is (one of) the longest, and the newcomer is the one
    /// refused.
    pub(super) fn push_out_for(&mut self, lane: u64) -> Option<Waiter> {
        let mine = self.per_lane.get(&lane).map_or(0, |l| l.waiting);
        let (&longest, count) = self
            .per_lane
            .iter()
            .map(|(lane, state)| (lane, state.waiting))
            .max_by_key(|(_, count)| *count)?;
        if count <= mine + 1 {
            return None;
        }
        let i = self.all.iter().rposition(|w| w.lane == longest)?;
        let ticket = self.all[i].ticket;
        self.remove(ticket)
    }

    /// One waiter fewer in `lane`: how many are left in it.
    fn count_out(&mut self, lane: u64) -> usize {
        let Some(state) = self.per_lane.get_mut(&lane) else {
            return 0;
        };
        state.waiting -= 1;
        let left = state.waiting;
        if left == 0 {
            self.total_weight -= u64::from(state.weight);
            self.per_lane.remove(&lane);
        }
        left
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use std::collections::BTreeMap;

    fn waiter(ticket: u64, lane: u64) -> Waiter {
        weighted(ticket, lane, 1)
    }

    fn weighted(ticket: u64, lane: u64, weight: u32) -> Waiter {
        Waiter {
            ticket,
            lane,
            weight,
            waker: None,
        }
    }

    fn order(waiters: &mut Waiters) -> Vec<(u64, u64)> {
        std::iter::from_fn(|| waiters.pop_next())
            .map(|w| (w.ticket, w.lane))
            .collect()
    }

    #[test]
    fn one_lane_is_arrival_order() {
        let mut waiters = Waiters::default();
        for ticket in 0..5 {
            waiters.push(waiter(ticket, 7), 7);
        }
        assert!(waiters.remove(2).is_some());
        let tickets: Vec<u64> = order(&mut waiters).iter().map(|w| w.0).collect();
        assert_eq!(tickets, [0, 1, 3, 4]);
    }

    #[test]
    fn a_lane_joining_behind_a_flood_goes_within_one_round() {
        let mut waiters = Waiters::default();
        for ticket in 0..500 {
            waiters.push(waiter(ticket, 1), u64::MAX);
        }
        waiters.push(waiter(500, 2), u64::MAX);
        let served = order(&mut waiters);
        assert_eq!(served[0], (0, 1));
        assert_eq!(served[1], (500, 2));
        assert_eq!(served.len(), 501);
    }

    #[test]
    fn a_lane_joining_goes_ahead_of_the_lane_that_just_had_its_turn() {
        let mut waiters = Waiters::default();
        // Lane 1 has a request in flight (the last permit) and more
        // waiting; lane 2 joins, then lane 3.
        for ticket in 0..3 {
            waiters.push(waiter(ticket, 1), 1);
        }
        waiters.push(waiter(3, 2), 1);
        waiters.push(waiter(4, 3), 1);
        let lanes: Vec<u64> = order(&mut waiters).iter().map(|w| w.1).collect();
        assert_eq!(lanes, [2, 3, 1, 1, 1]);
    }

    #[test]
    fn a_full_line_pushes_out_the_longest_lanes_newest() {
        let mut waiters = Waiters::default();
        for ticket in 0..4 {
            waiters.push(waiter(ticket, 1), 1);
        }
        waiters.push(waiter(4, 2), 1);
        let out = waiters.push_out_for(2).expect("lane 1 is longer");
        assert_eq!((out.ticket, out.lane), (3, 1));
        // Lane 1 now holds 3, lane 2 one: a newcomer of lane 2 still has
        // room made; lane 1's own newcomer never does.
        assert!(waiters.push_out_for(1).is_none());
        waiters.push(waiter(5, 2), 1);
        assert!(waiters.push_out_for(2).is_none());
        assert_eq!(waiters.len(), 5);
    }

    /// What a generated history does: a waiter joins a lane, the line
    /// serves one, or a waiter leaves.
    #[derive(Debug, Clone)]
    enum Step {
        Join(u64),
        Serve,
        Leave(usize),
    }

    fn step() -> impl Strategy<Value = Step> {
        prop_oneof![
            4 => (0u64..5).prop_map(Step::Join),
            3 => Just(Step::Serve),
            1 => (0usize..64).prop_map(Step::Leave),
        ]
    }

    fn weight_of(lane: u64) -> u32 {
        u32::try_from(lane % 3).unwrap_or(0) + 1
    }

    #[test]
    fn a_lane_of_weight_three_takes_three_in_a_row() {
        let mut waiters = Waiters::default();
        for ticket in 0..6 {
            waiters.push(weighted(ticket, 1, 3), u64::MAX);
        }
        for ticket in 6..9 {
            waiters.push(waiter(ticket, 2), u64::MAX);
        }
        let lanes: Vec<u64> = order(&mut waiters).iter().map(|w| w.1).collect();
        assert_eq!(lanes, [1, 1, 1, 2, 1, 1, 1, 2, 2]);
    }

    /// Lane 1 (weight 3) keeps a line; lane 2 sends its next request only
    /// once its last was answered, while lane 1 is in the middle of its
    /// turn: lane 1 still takes three to its one.
    #[test]
    fn a_heavy_lane_keeps_its_share_against_one_at_a_time_callers() {
        let mut waiters = Waiters::default();
        let mut next = 0;
        for _ in 0..30 {
            // Lane 1 has the permit in flight.
            waiters.push(weighted(next, 1, 3), 1);
            next += 1;
        }
        waiters.push(waiter(next, 2), 1);
        next += 1;
        let mut lanes = Vec::new();
        let mut answered = false;
        for _ in 0..16 {
            let served = waiters.pop_next().expect("a waiter");
            if answered {
                // Lane 2's answer came while lane 1's request went.
                waiters.push(waiter(next, 2), served.lane);
                next += 1;
            }
            answered = served.lane == 2;
            lanes.push(served.lane);
        }
        assert_eq!(lanes, [2, 1, 1, 1, 2, 1, 1, 1, 2, 1, 1, 1, 2, 1, 1, 1]);
    }

    #[test]
    fn the_turns_ahead_count_each_lanes_weight() {
        let mut waiters = Waiters::default();
        for ticket in 0..4 {
            waiters.push(weighted(ticket, 1, 3), u64::MAX);
        }
        waiters.push(waiter(4, 2), u64::MAX);
        // A newcomer of weight 1 in lane 3: first in its lane, behind one
        // turn of lane 1 (3) and of lane 2 (1).
        assert_eq!(waiters.turns_for(3, 1), 5);
        // Lane 2's second, weight 1: two turns of lane 1 go before it.
        assert_eq!(waiters.turns_for(2, 1), 2 + 2 * 3);
        // Lane 1's fifth, weight 3: two of its turns, each with one of lane 2.
        assert_eq!(waiters.turns_for(1, 3), 5 + 2);
        // Weights of 1 throughout: place times lanes.
        let mut even = Waiters::default();
        for ticket in 0..3 {
            even.push(waiter(ticket, ticket % 2), u64::MAX);
        }
        assert_eq!(even.turns_for(0, 1), 3 * 2);
        assert_eq!(even.turns_for(9, 1), 3);
    }

    proptest! {
        /// Over generated histories, lanes of weights 1 to 3: each lane is
        /// served in its arrival order; nobody is served twice or lost;
        /// and between a waiter becoming its lane's oldest and being
        /// served, no other lane is served more than its weight.
        #[test]
        fn lanes_take_turns_and_keep_their_order(steps in prop::collection::vec(step(), 1..300)) {
            let mut waiters = Waiters::default();
            let mut next = 0u64;
            // The lane served last (none yet).
            let mut last = u64::MAX;
            // Per lane, the tickets waiting, oldest first (the model);
            // ordered maps, so that a history replays from its seed.
            let mut lanes: BTreeMap<u64, VecDeque<u64>> = BTreeMap::new();
            // Per waiting ticket at the head of its lane: how many times
            // each other lane was served since it got there.
            let mut since_head: BTreeMap<u64, BTreeMap<u64, u32>> = BTreeMap::new();
            for step in steps {
                match step {
                    Step::Join(lane) => {
                        waiters.push(weighted(next, lane, weight_of(lane)), last);
                        let line = lanes.entry(lane).or_default();
                        line.push_back(next);
                        if line.len() == 1 {
                            since_head.insert(next, BTreeMap::new());
                        }
                        next += 1;
                    }
                    Step::Serve => {
                        let Some(w) = waiters.pop_next() else {
                            prop_assert!(lanes.values().all(VecDeque::is_empty));
                            continue;
                        };
                        last = w.lane;
                        let line = lanes.get_mut(&w.lane).expect("a lane with waiters");
                        prop_assert_eq!(line.pop_front(), Some(w.ticket), "lane order");
                        since_head.remove(&w.ticket);
                        if let Some(&head) = line.front() {
                            since_head.insert(head, BTreeMap::new());
                        }
                        for (head, served) in since_head.iter_mut() {
                            let count = served.entry(w.lane).or_default();
                            *count += 1;
                            prop_assert!(
                                *count <= weight_of(w.lane),
                                "{} waited while lane {} went {} times", head, w.lane, count
                            );
                        }
                    }
                    Step::Leave(n) => {
                        let all: Vec<u64> = lanes.values().flatten().copied().collect();
                        if all.is_empty() {
                            continue;
                        }
                        let ticket = all[n % all.len()];
                        let w = waiters.remove(ticket).expect("still waiting");
                        let line = lanes.get_mut(&w.lane).expect("its lane");
                        let at = line.iter().position(|&t| t == ticket).expect("in its lane");
                        line.remove(at);
                        since_head.remove(&ticket);
                        if at == 0 {
                            if let Some(&head) = line.front() {
                                since_head.insert(head, BTreeMap::new());
                            }
                        }
                    }
                }
                let waiting: usize = lanes.values().map(VecDeque::len).sum();
                prop_assert_eq!(waiters.len(), waiting);
            }
        }
    }
}
