//! Every log line a test binary writes, at every level, captured in memory.

use std::sync::{Mutex, OnceLock};

static LOGS: Mutex<Vec<u8>> = Mutex::new(Vec::new());

/// Writes into [`LOGS`].
struct Capture;

impl std::io::Write for Capture {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        LOGS.lock()
            .unwrap_or_else(|e| e.into_inner())
            .extend_from_slice(buf);
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// Capture every event of this process from now on, as the proxy's
/// `tracing_subscriber::fmt` writes them (without colours, so that any
/// escape byte in the output came from a logged value).
pub fn capture_logs() {
    static INSTALLED: OnceLock<()> = OnceLock::new();
    INSTALLED.get_or_init(|| {
        let subscriber = tracing_subscriber::fmt()
            .with_max_level(tracing::Level::TRACE)
            .with_ansi(false)
            .with_writer(|| Capture)
            .finish();
        let _ = tracing::subscriber::set_global_default(subscriber);
    });
}

/// Everything logged so far, as written.
pub fn log_bytes() -> Vec<u8> {
    LOGS.lock().unwrap_or_else(|e| e.into_inner()).clone()
}

/// Everything logged so far, as text.
pub fn log_text() -> String {
    String::from_utf8_lossy(&log_bytes()).into_owned()
}

/// The control characters in `text` other than the line feeds that end
/// lines (and tabs): each with its byte offset. Empty when `text` is safe to
/// show in a terminal, line by line.
pub fn stray_controls(text: &str) -> Vec<(usize, char)> {
    text.char_indices()
        .filter(|&(_, c)| c.is_control() && c != '\n' && c != '\t')
        .collect()
}

/// The lines of `text` that start with `forged`: a logged value's raw line
/// feed made each of them look like an event of its own.
pub fn forged_lines<'a>(text: &'a str, forged: &str) -> Vec<&'a str> {
    text.lines().filter(|l| l.starts_with(forged)).collect()
}
