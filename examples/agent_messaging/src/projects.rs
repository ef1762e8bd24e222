//! The projects file: which nodes (agents) exist, in which projects, and
//! how many messages each node's inbox holds. Read once at start; the
//! scope check reads nothing else.
//!
//! ```json
//! {"projects":[{"id":"p1","nodes":[{"id":"a"},{"id":"b","inbox_capacity":10}]}]}
//! ```
//!
//! A node id may be listed in several projects: it is one node (one
//! inbox) that belongs to each. Ids are 1 to 64 characters of
//! `[A-Za-z0-9._-]`, the only ones a node can be addressed by.

use std::collections::HashMap;
use std::collections::hash_map::Entry;
use std::fmt;
use std::path::Path;

use serde::Deserialize;
use tower_throttle::redact::Escaped;

/// The longest node or project id.
pub const MAX_ID_LEN: usize = 64;

/// An inbox's size when the file does not say.
pub const DEFAULT_INBOX_CAPACITY: usize = 100;

/// The largest inbox a file may ask for: memory is held per message.
pub const MAX_INBOX_CAPACITY: usize = 10_000;

/// The largest projects file read.
pub const MAX_FILE_BYTES: u64 = 1 << 20;

/// The embedded demo: alice, bob (a small inbox) and carol in `demo`;
/// mallory in `other`.
pub const DEMO: &str = r#"{"projects":[
  {"id":"demo","nodes":[{"id":"alice"},{"id":"bob","inbox_capacity":10},{"id":"carol"}]},
  {"id":"other","nodes":[{"id":"mallory"}]}
]}"#;

/// Whether `id` can name a node: 1 to [`MAX_ID_LEN`] characters of
/// `[A-Za-z0-9._-]`.
pub fn addressable(id: &str) -> bool {
    (1..=MAX_ID_LEN).contains(&id.len())
        && id
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'))
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct FileShape {
    projects: Vec<ProjectShape>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct ProjectShape {
    id: String,
    nodes: Vec<NodeShape>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct NodeShape {
    id: String,
    inbox_capacity: Option<usize>,
}

/// What is wrong with a projects file, naming the field.
#[derive(Debug)]
pub struct ProjectsError(String);

impl fmt::Display for ProjectsError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for ProjectsError {}

/// One node: the projects it is listed in (indexes into the file's
/// order, ascending) and its inbox's capacity.
#[derive(Debug)]
pub struct Node {
    projects: Vec<usize>,
    pub inbox_capacity: usize,
}

/// The projects and their nodes, as the file says.
#[derive(Debug)]
pub struct Directory {
    projects: Vec<String>,
    nodes: HashMap<String, Node>,
}

impl Directory {
    /// The embedded demo.
    pub fn demo() -> Result<Self, ProjectsError> {
        Self::parse(DEMO)
    }

    /// Read and check the file at `path`.
    pub fn load(path: &Path) -> Result<Self, ProjectsError> {
        let shown = Escaped(&path.to_string_lossy()).to_string();
        let size = std::fs::metadata(path)
            .map_err(|e| ProjectsError(format!("cannot read {shown}: {e}")))?
            .len();
        if size > MAX_FILE_BYTES {
            return Err(ProjectsError(format!(
                "{shown} is {size} bytes; at most {MAX_FILE_BYTES} are read"
            )));
        }
        let text = std::fs::read_to_string(path)
            .map_err(|e| ProjectsError(format!("cannot read {shown}: {e}")))?;
        Self::parse(&text).map_err(|e| ProjectsError(format!("{shown}: {e}")))
    }

    /// Check a projects file's text.
    pub fn parse(text: &str) -> Result<Self, ProjectsError> {
        let file: FileShape = serde_json::from_str(text)
            .map_err(|e| ProjectsError(format!("not a projects file: {e}")))?;
        let mut directory = Directory {
            projects: Vec::new(),
            nodes: HashMap::new(),
        };
        for (p, project) in file.projects.into_iter().enumerate() {
            let at = format!("projects[{p}]");
            if !addressable(&project.id) {
                return Err(not_addressable(&format!("{at}.id"), &project.id));
            }
            if directory.projects.contains(&project.id) {
                return Err(ProjectsError(format!(
                    "{at}.id: project `{}` is listed twice",
                    project.id
                )));
            }
            for (n, node) in project.nodes.into_iter().enumerate() {
                directory.add_node(p, &format!("{at}.nodes[{n}]"), node)?;
            }
            directory.projects.push(project.id);
        }
        Ok(directory)
    }

    fn add_node(&mut self, project: usize, at: &str, node: NodeShape) -> Result<(), ProjectsError> {
        if !addressable(&node.id) {
            return Err(not_addressable(&format!("{at}.id"), &node.id));
        }
        let capacity = node.inbox_capacity.unwrap_or(DEFAULT_INBOX_CAPACITY);
        if !(1..=MAX_INBOX_CAPACITY).contains(&capacity) {
            return Err(ProjectsError(format!(
                "{at}.inbox_capacity: {capacity} is not between 1 and {MAX_INBOX_CAPACITY}"
            )));
        }
        match self.nodes.entry(node.id) {
            Entry::Vacant(slot) => {
                slot.insert(Node {
                    projects: vec![project],
                    inbox_capacity: capacity,
                });
            }
            Entry::Occupied(mut listed) => {
                let id = listed.key().clone();
                let listed = listed.get_mut();
                if listed.projects.contains(&project) {
                    return Err(ProjectsError(format!(
                        "{at}.id: node `{id}` is listed twice in one project"
                    )));
                }
                // One node, one inbox: its size cannot differ by project.
                if node
                    .inbox_capacity
                    .is_some_and(|c| c != listed.inbox_capacity)
                {
                    return Err(ProjectsError(format!(
                        "{at}.inbox_capacity: node `{id}` has inbox_capacity {} where it is \
                         listed before",
                        listed.inbox_capacity
                    )));
                }
                listed.projects.push(project);
            }
        }
        Ok(())
    }

    /// The project `from` may write to `to` in: the first, in the file's
    /// order, of the sender's projects that lists the receiver too. `None`
    /// (fail closed) when either is listed nowhere, or they share none.
    pub fn shared_project(&self, from: &str, to: &str) -> Option<&str> {
        let (from, to) = (self.nodes.get(from)?, self.nodes.get(to)?);
        let shared = from.projects.iter().find(|p| to.projects.contains(p))?;
        self.projects.get(*shared).map(String::as_str)
    }

    /// The node called `id`.
    pub fn node(&self, id: &str) -> Option<&Node> {
        self.nodes.get(id)
    }

    /// Every node, by id.
    pub fn nodes(&self) -> impl Iterator<Item = (&str, &Node)> {
        self.nodes.iter().map(|(id, node)| (id.as_str(), node))
    }
}

fn not_addressable(at: &str, id: &str) -> ProjectsError {
    ProjectsError(format!(
        "{at}: \"{}\" is not an id (1 to {MAX_ID_LEN} characters of [A-Za-z0-9._-])",
        Escaped(id)
    ))
}
