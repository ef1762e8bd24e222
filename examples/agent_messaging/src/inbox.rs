//! Delivery: one bounded inbox per node of the projects file, and the
//! service at the bottom of the stack that puts a message in one.

use std::collections::{HashMap, VecDeque};
use std::convert::Infallible;
use std::future::{Ready, ready};
use std::sync::Arc;
use std::task::{Context, Poll};

use parking_lot::Mutex;
use serde::Serialize;
use tower::Service;

use crate::projects::Directory;

/// A message that passed every check but the rate limits: what the limits
/// are keyed by (`from`, and the pair `(from, to)`) and what is delivered.
#[derive(Clone, Debug)]
pub struct Message {
    pub from: Arc<str>,
    pub to: Arc<str>,
    /// The project the two share, where it is delivered.
    pub project: Arc<str>,
    pub text: String,
}

/// A message in an inbox, as `GET /nodes/{id}/inbox` gives it.
#[derive(Clone, Debug, Serialize)]
pub struct Stored {
    pub id: String,
    pub from: String,
    pub project: String,
    pub text: String,
}

/// What became of a message.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Delivery {
    /// In the receiver's inbox, with its id (a ULID).
    Delivered(String),
    /// The receiver's inbox is full: not delivered, nothing used.
    Busy,
}

/// One inbox: at most `capacity` messages until its node drains it.
#[derive(Debug)]
struct Inbox {
    capacity: usize,
    messages: Mutex<VecDeque<Stored>>,
}

/// Every node's inbox, made once from the projects file: a node nobody
/// listed has none, so memory is bounded by the file.
#[derive(Debug)]
pub struct Inboxes(HashMap<String, Inbox>);

impl Inboxes {
    pub fn new(directory: &Directory) -> Self {
        let boxes = directory
            .nodes()
            .map(|(id, node)| {
                let inbox = Inbox {
                    capacity: node.inbox_capacity,
                    messages: Mutex::new(VecDeque::new()),
                };
                (id.to_owned(), inbox)
            })
            .collect();
        Self(boxes)
    }

    /// Take every message in `node`'s inbox, oldest first; `None` for a
    /// node that has none.
    pub fn drain(&self, node: &str) -> Option<Vec<Stored>> {
        let inbox = self.0.get(node)?;
        Some(inbox.messages.lock().drain(..).collect())
    }

    /// How many messages wait in every inbox.
    pub fn waiting(&self) -> usize {
        self.0
            .values()
            .map(|inbox| inbox.messages.lock().len())
            .sum()
    }

    fn deliver(&self, message: Message) -> Delivery {
        let Some(inbox) = self.0.get(&*message.to) else {
            // Not reached: the scope check lets only listed nodes through.
            return Delivery::Busy;
        };
        let mut messages = inbox.messages.lock();
        if messages.len() >= inbox.capacity {
            return Delivery::Busy;
        }
        let id = ulid::Ulid::generate().to_string();
        messages.push_back(Stored {
            id: id.clone(),
            from: message.from.to_string(),
            project: message.project.to_string(),
            text: message.text,
        });
        Delivery::Delivered(id)
    }
}

/// Puts each message in its receiver's inbox, or answers
/// [`Delivery::Busy`] when that is full.
#[derive(Clone, Debug)]
pub struct Deliver(pub Arc<Inboxes>);

impl Service<Message> for Deliver {
    type Response = Delivery;
    type Error = Infallible;
    type Future = Ready<Result<Delivery, Infallible>>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, message: Message) -> Self::Future {
        ready(Ok(self.0.deliver(message)))
    }
}
