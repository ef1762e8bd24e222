//! The access log's writer: a thread of its own that takes the lines
//! requests left in a shared list every [`FLUSH_EVERY`], so that a request
//! pays a push under a lock (no wake-up of another thread, no system call)
//! and a slow disk never holds one; a line that finds the list full is
//! dropped and counted.

use std::fs::{File, OpenOptions};
use std::io::{self, BufWriter, Write};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use parking_lot::{Condvar, Mutex};
use tower_throttle::redact::Escaped;

/// Bytes written out at once at most.
const BUFFER: usize = 64 << 10;

/// Lines waiting for the writer at most; beyond, lines are dropped.
pub const QUEUE_LINES: usize = 16_384;

/// How often the writer takes the waiting lines and writes them out: a
/// line reaches its file within this long.
pub const FLUSH_EVERY: Duration = Duration::from_millis(50);

/// Where the lines go.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Destination {
    /// The process's standard error.
    Stderr,
    /// A file, renamed to `<file>.1` (replacing the last) when a line
    /// would take it past `max_bytes`.
    File {
        /// The file, created if missing, appended to if not.
        path: PathBuf,
        /// Largest size before it is rotated.
        max_bytes: u64,
    },
}

#[derive(Default)]
struct Waiting {
    lines: Vec<String>,
    /// Callers of `flush`, told once what came before them is written.
    flushes: Vec<tokio::sync::oneshot::Sender<()>>,
}

#[derive(Default)]
struct Shared {
    waiting: Mutex<Waiting>,
    /// Wakes the writer early: a flush, or the last sender gone.
    wake: Condvar,
    dropped: AtomicU64,
}

/// The sending side; cheap to clone. The writer ends, after writing what
/// is left, when the last clone is dropped.
#[derive(Clone)]
pub struct Writer {
    shared: Arc<Shared>,
    _last: Arc<Last>,
}

impl std::fmt::Debug for Writer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Writer").finish_non_exhaustive()
    }
}

/// Dropped with the last `Writer`: wakes the thread to end.
struct Last(Arc<Shared>);

impl Drop for Last {
    fn drop(&mut self) {
        self.0.wake.notify_one();
    }
}

impl Writer {
    /// Open `to` and start the thread writing to it.
    pub fn start(to: &Destination) -> io::Result<Self> {
        let sink = Sink::open(to)?;
        let shared = Arc::new(Shared::default());
        let last = Arc::new(Last(shared.clone()));
        let watched = Arc::downgrade(&last);
        let thread = shared.clone();
        std::thread::Builder::new()
            .name("access-log".into())
            .spawn(move || run(sink, &thread, || watched.strong_count() == 0))?;
        Ok(Self {
            shared,
            _last: last,
        })
    }

    /// Queue `line` (one line, its newline included); dropped and counted
    /// when the writer is behind.
    pub fn send(&self, line: String) {
        let mut waiting = self.shared.waiting.lock();
        if waiting.lines.len() < QUEUE_LINES {
            waiting.lines.push(line);
            return;
        }
        drop(waiting);
        if self.shared.dropped.fetch_add(1, Ordering::Relaxed) == 0 {
            tracing::warn!(
                "access log: the writer is behind; lines are dropped (counted in \
                 proxy_access_log_dropped_total)"
            );
        }
    }

    /// Lines dropped so far (the writer behind, or failing).
    pub fn dropped(&self) -> u64 {
        self.shared.dropped.load(Ordering::Relaxed)
    }

    /// Wait until every line queued before this call is written out.
    pub async fn flush(&self) {
        let (done, wait) = tokio::sync::oneshot::channel();
        self.shared.waiting.lock().flushes.push(done);
        self.shared.wake.notify_one();
        let _ = wait.await;
    }
}

enum Sink {
    Stderr(BufWriter<io::Stderr>),
    File {
        out: BufWriter<File>,
        path: PathBuf,
        max_bytes: u64,
        size: u64,
    },
}

impl Sink {
    fn open(to: &Destination) -> io::Result<Self> {
        Ok(match to {
            Destination::Stderr => Self::Stderr(BufWriter::with_capacity(BUFFER, io::stderr())),
            Destination::File { path, max_bytes } => {
                let file = append(path)?;
                let size = file.metadata()?.len();
                Self::File {
                    out: BufWriter::with_capacity(BUFFER, file),
                    path: path.clone(),
                    max_bytes: *max_bytes,
                    size,
                }
            }
        })
    }

    fn write(&mut self, line: &str) -> io::Result<()> {
        match self {
            Self::Stderr(err) => err.write_all(line.as_bytes()),
            Self::File {
                out,
                path,
                max_bytes,
                size,
            } => {
                let len = line.len() as u64;
                if *size > 0 && *size + len > *max_bytes {
                    // Counted from zero again whatever happens: a rotation
                    // that fails is tried again a whole size later, the
                    // lines meanwhile kept in the file as it is.
                    *size = 0;
                    out.flush()?;
                    let reopened =
                        std::fs::rename(&*path, rotated(path)).and_then(|()| append(path));
                    match reopened {
                        Ok(file) => *out = BufWriter::with_capacity(BUFFER, file),
                        Err(e) => tracing::warn!(
                            error = %Escaped(&e.to_string()),
                            "access log: cannot rotate; writing on in the same file"
                        ),
                    }
                }
                out.write_all(line.as_bytes())?;
                *size += len;
                Ok(())
            }
        }
    }

    fn flush(&mut self) -> io::Result<()> {
        match self {
            Self::Stderr(err) => err.flush(),
            Self::File { out, .. } => out.flush(),
        }
    }
}

fn append(path: &Path) -> io::Result<File> {
    OpenOptions::new().create(true).append(true).open(path)
}

/// `<path>.1`: the one file kept from before the last rotation.
pub fn rotated(path: &Path) -> PathBuf {
    let mut name = path.as_os_str().to_owned();
    name.push(".1");
    PathBuf::from(name)
}

/// Every [`FLUSH_EVERY`] (or when woken), write what is waiting and flush;
/// end once `ended` and nothing is left.
fn run(mut sink: Sink, shared: &Shared, ended: impl Fn() -> bool) {
    let mut failing = false;
    loop {
        let (lines, flushes) = {
            let mut waiting = shared.waiting.lock();
            if waiting.flushes.is_empty() && !ended() {
                shared.wake.wait_for(&mut waiting, FLUSH_EVERY);
            }
            (
                std::mem::take(&mut waiting.lines),
                std::mem::take(&mut waiting.flushes),
            )
        };
        let last = lines.is_empty() && ended();
        for line in &lines {
            match sink.write(line) {
                Ok(()) => failing = false,
                Err(e) => {
                    shared.dropped.fetch_add(1, Ordering::Relaxed);
                    if !failing {
                        tracing::warn!(error = %Escaped(&e.to_string()), "access log: cannot write");
                    }
                    failing = true;
                }
            }
        }
        let _ = sink.flush();
        for done in flushes {
            let _ = done.send(());
        }
        if last {
            return;
        }
    }
}
