//! The access log's writer: a thread of its own, fed through a bounded
//! channel, so that a slow disk never holds a request; a line that finds
//! the channel full is dropped and counted.

use std::fs::{File, OpenOptions};
use std::io::{self, BufWriter, Write};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc::{Receiver, RecvTimeoutError, SyncSender, TrySendError, sync_channel};
use std::time::{Duration, Instant};

use tower_throttle::redact::Escaped;

/// Bytes written out at once at most.
const BUFFER: usize = 64 << 10;

/// Lines waiting for the writer at most; beyond, lines are dropped.
pub const QUEUE_LINES: usize = 8192;

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

enum Message {
    Line(String),
    Flush(tokio::sync::oneshot::Sender<()>),
}

/// The sending side; cheap to clone.
#[derive(Clone, Debug)]
pub struct Writer {
    tx: SyncSender<Message>,
    dropped: Arc<AtomicU64>,
}

impl Writer {
    /// Open `to` and start the thread writing to it.
    pub fn start(to: &Destination) -> io::Result<Self> {
        let sink = Sink::open(to)?;
        let (tx, rx) = sync_channel(QUEUE_LINES);
        let dropped = Arc::new(AtomicU64::new(0));
        let counted = dropped.clone();
        std::thread::Builder::new()
            .name("access-log".into())
            .spawn(move || run(sink, rx, counted))?;
        Ok(Self { tx, dropped })
    }

    /// Queue `line` (one line, its newline included); dropped and counted
    /// when the writer is behind.
    pub fn send(&self, line: String) {
        match self.tx.try_send(Message::Line(line)) {
            Ok(()) => {}
            Err(TrySendError::Full(_) | TrySendError::Disconnected(_)) => {
                if self.dropped.fetch_add(1, Ordering::Relaxed) == 0 {
                    tracing::warn!(
                        "access log: the writer is behind; lines are dropped (counted in \
                         proxy_access_log_dropped_total)"
                    );
                }
            }
        }
    }

    /// Lines dropped so far (the writer behind, or failing).
    pub fn dropped(&self) -> u64 {
        self.dropped.load(Ordering::Relaxed)
    }

    /// Wait until every line queued before this call is written out.
    pub async fn flush(&self) {
        let (done, wait) = tokio::sync::oneshot::channel();
        let tx = self.tx.clone();
        // `send` blocks while the queue is full: off the runtime's threads.
        let sent = tokio::task::spawn_blocking(move || tx.send(Message::Flush(done)).is_ok());
        if sent.await.unwrap_or(false) {
            let _ = wait.await;
        }
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
                    out.flush()?;
                    std::fs::rename(&*path, rotated(path))?;
                    *out = BufWriter::with_capacity(BUFFER, append(path)?);
                    *size = 0;
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

/// Longest a written line waits in the buffer before it is flushed: lines
/// go out in blocks (one write for many requests), and reach the file
/// within this long.
pub const FLUSH_EVERY: Duration = Duration::from_millis(100);

/// Write what arrives; flush when [`FLUSH_EVERY`] has passed since the
/// oldest line not flushed, when asked, and at the end.
fn run(mut sink: Sink, rx: Receiver<Message>, dropped: Arc<AtomicU64>) {
    let mut failing = false;
    // When the oldest line not yet flushed was written.
    let mut unflushed: Option<Instant> = None;
    loop {
        let message = match unflushed {
            None => rx.recv().map_err(|_| RecvTimeoutError::Disconnected),
            Some(since) => rx.recv_timeout(FLUSH_EVERY.saturating_sub(since.elapsed())),
        };
        let result = match message {
            Ok(Message::Line(line)) => {
                unflushed.get_or_insert_with(Instant::now);
                sink.write(&line)
            }
            Ok(Message::Flush(done)) => {
                unflushed = None;
                let flushed = sink.flush();
                let _ = done.send(());
                flushed
            }
            Err(RecvTimeoutError::Timeout) => {
                unflushed = None;
                sink.flush()
            }
            Err(RecvTimeoutError::Disconnected) => break,
        };
        if unflushed.is_some_and(|since| since.elapsed() >= FLUSH_EVERY) {
            unflushed = None;
            let _ = sink.flush();
        }
        match result {
            Ok(()) => failing = false,
            Err(e) => {
                dropped.fetch_add(1, Ordering::Relaxed);
                if !failing {
                    tracing::warn!(error = %Escaped(&e.to_string()), "access log: cannot write");
                }
                failing = true;
            }
        }
    }
    let _ = sink.flush();
}
