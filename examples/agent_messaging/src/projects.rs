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
//!
//! A node's key, which a request presents to act as it, is named by
//! reference, never written in the file: `"key_env": "ALICE_KEY"` (an
//! environment variable) or `"key_file": "keys/alice"` (relative to the
//! projects file). Either every node has a key or none does.

use std::collections::HashMap;
use std::collections::hash_map::Entry;
use std::fmt;
use std::path::{Path, PathBuf};

use serde::Deserialize;
use serde::de::IgnoredAny;
use tower_throttle::redact::Escaped;

use crate::auth::{Access, MAX_KEY_BYTES, Secret};

/// Environment lookup (the process's, or a test's).
pub type Env<'a> = &'a dyn Fn(&str) -> Option<String>;

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
    key_env: Option<String>,
    key_file: Option<PathBuf>,
    /// Read only to refuse it with a clear error: keys are never inline.
    key: Option<IgnoredAny>,
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
    /// Who may act as which node, and the operator.
    pub access: Access,
}

/// Where a file's keys are looked up.
struct Lookup<'a> {
    env: Env<'a>,
    /// What a relative `key_file` is relative to.
    base: &'a Path,
    keys: Vec<(String, Secret)>,
    /// Nodes listed without a key (by their first place in the file).
    keyless: Vec<String>,
}

impl Directory {
    /// The embedded demo.
    pub fn demo() -> Result<Self, ProjectsError> {
        Self::parse(DEMO)
    }

    /// Read and check the file at `path`, its keys from the process's
    /// environment and from files beside it.
    pub fn load(path: &Path) -> Result<Self, ProjectsError> {
        let env = |name: &str| std::env::var(name).ok();
        Self::load_with(path, &env)
    }

    /// [`Directory::load`] with `env` for the environment.
    pub fn load_with(path: &Path, env: Env<'_>) -> Result<Self, ProjectsError> {
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
        let base = path.parent().unwrap_or(Path::new("."));
        Self::parse_with(&text, env, base).map_err(|e| ProjectsError(format!("{shown}: {e}")))
    }

    /// Check a projects file's text (one naming no keys: nothing is looked
    /// up).
    pub fn parse(text: &str) -> Result<Self, ProjectsError> {
        Self::parse_with(text, &|_| None, Path::new("."))
    }

    /// Check a projects file's text, looking its keys up in `env` and in
    /// files relative to `base`.
    pub fn parse_with(text: &str, env: Env<'_>, base: &Path) -> Result<Self, ProjectsError> {
        let file: FileShape = serde_json::from_str(text)
            .map_err(|e| ProjectsError(format!("not a projects file: {e}")))?;
        let mut directory = Directory {
            projects: Vec::new(),
            nodes: HashMap::new(),
            access: Access::default(),
        };
        let mut lookup = Lookup {
            env,
            base,
            keys: Vec::new(),
            keyless: Vec::new(),
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
                let at = format!("{at}.nodes[{n}]");
                if !addressable(&node.id) {
                    return Err(not_addressable(&format!("{at}.id"), &node.id));
                }
                lookup.key_of(&at, &node)?;
                directory.add_node(p, &at, node)?;
            }
            directory.projects.push(project.id);
        }
        directory.access = lookup.finish()?;
        Ok(directory)
    }

    fn add_node(&mut self, project: usize, at: &str, node: NodeShape) -> Result<(), ProjectsError> {
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

impl Lookup<'_> {
    /// Look up `node`'s key, if the file names one.
    fn key_of(&mut self, at: &str, node: &NodeShape) -> Result<(), ProjectsError> {
        let key = match (&node.key, &node.key_env, &node.key_file) {
            (Some(_), ..) => {
                return Err(ProjectsError(format!(
                    "{at}.key: a key is never written in the projects file; name it with \
                     key_env or key_file"
                )));
            }
            (None, Some(_), Some(_)) => {
                return Err(ProjectsError(format!(
                    "{at}: key_env and key_file both name a key; give one"
                )));
            }
            (None, Some(name), None) => {
                let shown = Escaped(name);
                let value = (self.env)(name)
                    .ok_or_else(|| ProjectsError(format!("{at}.key_env: ${shown} is not set")))?;
                Secret::new(&value, &format!("{at}.key_env: ${shown}")).map_err(ProjectsError)?
            }
            (None, None, Some(file)) => self.read_key(at, file)?,
            (None, None, None) => {
                self.keyless.push(node.id.clone());
                return Ok(());
            }
        };
        match self.keys.iter().find(|(id, _)| *id == node.id) {
            // Listed in several projects: the key, wherever it is named,
            // is the one node's.
            Some((_, known)) if *known == key => {}
            Some(_) => {
                return Err(ProjectsError(format!(
                    "{at}: node `{}` has another key where it is listed before",
                    node.id
                )));
            }
            None => {
                if let Some((other, _)) = self.keys.iter().find(|(_, k)| *k == key) {
                    return Err(ProjectsError(format!(
                        "{at}: node `{}` has the key of node `{other}`; each node needs its own",
                        node.id
                    )));
                }
                self.keys.push((node.id.clone(), key));
            }
        }
        Ok(())
    }

    fn read_key(&self, at: &str, file: &Path) -> Result<Secret, ProjectsError> {
        let path = self.base.join(file);
        let shown = Escaped(&path.to_string_lossy()).to_string();
        let unreadable =
            |e: std::io::Error| ProjectsError(format!("{at}.key_file: cannot read {shown}: {e}"));
        // A key file is small: never read a large (or endless) one whole.
        let size = std::fs::metadata(&path).map_err(unreadable)?.len();
        if size > (MAX_KEY_BYTES + 2) as u64 {
            return Err(ProjectsError(format!(
                "{at}.key_file: {shown} is {size} bytes; a key is at most {MAX_KEY_BYTES}"
            )));
        }
        let text = std::fs::read_to_string(&path).map_err(unreadable)?;
        Secret::new(&text, &format!("{at}.key_file: {shown}")).map_err(ProjectsError)
    }

    /// Every node has a key, or none does.
    fn finish(self) -> Result<Access, ProjectsError> {
        if self.keys.is_empty() {
            return Ok(Access::default());
        }
        if let Some(id) = self
            .keyless
            .iter()
            .find(|id| !self.keys.iter().any(|(keyed, _)| keyed == *id))
        {
            return Err(ProjectsError(format!(
                "node `{id}` has no key while others do: give every node key_env or key_file \
                 (or none, for a service on a loopback address only)"
            )));
        }
        Ok(Access::new(self.keys))
    }
}

fn not_addressable(at: &str, id: &str) -> ProjectsError {
    ProjectsError(format!(
        "{at}: \"{}\" is not an id (1 to {MAX_ID_LEN} characters of [A-Za-z0-9._-])",
        Escaped(id)
    ))
}
