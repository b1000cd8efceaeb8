//! Reading what a sandboxed process writes without letting it block or flood the host:
//! stdout up to a cap ([`read_capped`]), stderr drained to the end with only its tail kept
//! ([`Tail`]), and the sandbox's start marker (see [`crate::argv::STARTED_MARKER`]) splitting
//! the tools' diagnostics from the program's own stderr.

use tokio::io::{AsyncRead, AsyncReadExt};

/// Stderr kept (its tail: that is where tracebacks are).
pub(crate) const STDERR_KEEP: usize = 64 * 1024;
/// Diagnostics kept from the sandbox's tools (before the marker).
const DIAGNOSTICS_KEEP: usize = 8 * 1024;

/// Reads into `buf` until EOF or until more than `limit` bytes arrive; true when cut.
pub(crate) async fn read_capped<R: AsyncRead + Unpin>(
    reader: Option<&mut R>,
    buf: &mut Vec<u8>,
    limit: usize,
) -> bool {
    let Some(reader) = reader else {
        return false;
    };
    let mut chunk = vec![0u8; 64 * 1024];
    loop {
        match reader.read(&mut chunk).await {
            Ok(0) => return false,
            Ok(n) => {
                let room = limit.saturating_sub(buf.len());
                if n > room {
                    buf.extend_from_slice(&chunk[..room]);
                    return true;
                }
                buf.extend_from_slice(&chunk[..n]);
            }
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => {
                tracing::warn!(error = %e, "sandbox: reading stdout failed");
                return false;
            }
        }
    }
}

/// Drains `reader` to EOF, keeping its tail (a chatty stderr must not block the process).
pub(crate) async fn read_tail<R: AsyncRead + Unpin>(reader: Option<&mut R>, tail: &mut Tail) {
    let Some(reader) = reader else {
        return;
    };
    let mut chunk = vec![0u8; 16 * 1024];
    loop {
        match reader.read(&mut chunk).await {
            Ok(0) => return,
            Ok(n) => tail.push(&chunk[..n]),
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => {
                tracing::warn!(error = %e, "sandbox: reading stderr failed");
                return;
            }
        }
    }
}

/// The last `keep` bytes of a stream. With a marker, what comes before it is kept apart
/// (the sandbox tools' diagnostics) and the tail starts after it.
#[derive(Debug)]
pub(crate) struct Tail {
    buf: Vec<u8>,
    keep: usize,
    dropped: bool,
    /// Waiting for this marker; `None` once seen (or when there is none).
    marker: Option<&'static [u8]>,
    /// Before the marker.
    pre: Vec<u8>,
}

impl Tail {
    fn new(keep: usize) -> Self {
        Tail {
            buf: Vec::new(),
            keep,
            dropped: false,
            marker: None,
            pre: Vec::new(),
        }
    }

    pub(crate) fn with_marker(keep: usize, marker: &'static [u8]) -> Self {
        Tail {
            marker: Some(marker),
            ..Tail::new(keep)
        }
    }

    pub(crate) fn push(&mut self, data: &[u8]) {
        let data = match self.marker {
            Some(marker) => {
                self.pre.extend_from_slice(data);
                let Some(at) = self.pre.windows(marker.len()).position(|w| w == marker) else {
                    // Keep the diagnostics' tail, and enough to find a marker cut in two.
                    if self.pre.len() > DIAGNOSTICS_KEEP * 2 {
                        let excess = self.pre.len() - DIAGNOSTICS_KEEP;
                        self.pre.drain(..excess);
                    }
                    return;
                };
                self.marker = None;
                let after = self.pre.split_off(at + marker.len());
                self.pre.truncate(at);
                after
            }
            None => data.to_vec(),
        };
        self.buf.extend_from_slice(&data);
        // Trim in batches so a byte-at-a-time writer does not cost a memmove per byte.
        if self.buf.len() > self.keep * 2 {
            let excess = self.buf.len() - self.keep;
            self.buf.drain(..excess);
            self.dropped = true;
        }
    }

    /// Whether the marker was seen (always, without one).
    pub(crate) fn started(&self) -> bool {
        self.marker.is_none()
    }

    /// What came before the marker: the sandbox tools' diagnostics.
    pub(crate) fn diagnostics(&self) -> &[u8] {
        &self.pre
    }

    /// The kept bytes, and whether anything was dropped. Before the marker was seen, the
    /// kept bytes are the tools' diagnostics.
    pub(crate) fn finish(mut self) -> (Vec<u8>, bool) {
        if self.marker.is_some() {
            let mut pre = self.pre;
            if pre.len() > DIAGNOSTICS_KEEP {
                let excess = pre.len() - DIAGNOSTICS_KEEP;
                pre.drain(..excess);
            }
            return (pre, false);
        }
        if self.buf.len() > self.keep {
            let excess = self.buf.len() - self.keep;
            self.buf.drain(..excess);
            self.dropped = true;
        }
        (self.buf, self.dropped)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::argv::STARTED_MARKER;

    #[test]
    fn tail_keeps_the_end() {
        let mut t = Tail::new(4);
        t.push(b"abcdefghij");
        t.push(b"kl");
        assert_eq!(t.finish(), (b"ijkl".to_vec(), true));
        let mut t = Tail::new(4);
        t.push(b"abcde");
        assert_eq!(t.finish(), (b"bcde".to_vec(), true));
        let mut t = Tail::new(4);
        t.push(b"abcd");
        assert_eq!(t.finish(), (b"abcd".to_vec(), false));
    }

    #[test]
    fn the_start_marker_splits_diagnostics_from_the_programs_stderr() {
        let mut t = Tail::with_marker(1024, STARTED_MARKER);
        t.push(b"bwrap: some warning\n\x1eskilleval-sand");
        assert!(!t.started());
        t.push(b"box: exec\nTraceback: boom\n");
        assert!(t.started());
        assert_eq!(t.finish(), (b"Traceback: boom\n".to_vec(), false));

        let mut t = Tail::with_marker(1024, STARTED_MARKER);
        t.push(b"bwrap: Can't fork for pid 1: Resource temporarily unavailable\n");
        assert!(!t.started());
        assert_eq!(
            t.finish().0,
            b"bwrap: Can't fork for pid 1: Resource temporarily unavailable\n".to_vec()
        );
    }
}
