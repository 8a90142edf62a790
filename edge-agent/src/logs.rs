//! A job's output as log events: reads stdout and stderr concurrently, decodes UTF-8 across read
//! boundaries, coalesces what arrives within a short window into one chunk (so a chatty job does
//! not cost one HTTP request per line), caps chunks at [`MAX_CHUNK_BYTES`], and numbers them
//! with one gap-free sequence across both streams. Sending into the outbox waits when the outbox
//! is full, so a job that outruns the broker is slowed down (its pipe fills), never truncated.

use crate::outbox::EventSink;
use std::collections::VecDeque;
use std::time::Duration;
use switchyard_protocol::agent::{AgentEvent, AttemptRef, Stream};
use tokio::io::{AsyncRead, AsyncReadExt};
use tokio::sync::{mpsc, watch};
use tokio::time::Instant;

/// Largest `data` of one log event, in bytes.
pub const MAX_CHUNK_BYTES: usize = 64 * 1024;
/// Output that arrives within this window after the first pending byte goes out as one chunk.
pub const COALESCE_WINDOW: Duration = Duration::from_millis(150);
/// How long a pipe may stay open and silent after the job's processes are gone.
pub const PIPE_IDLE_AFTER_END: Duration = Duration::from_secs(5);
const READ_BUFFER: usize = 16 * 1024;

/// Bytes read from one stream of the process.
#[derive(Debug)]
pub struct Piece {
    pub stream: Stream,
    pub bytes: Vec<u8>,
}

/// Reads a pipe to its end, forwarding what it reads. Forwarding waits for room (the outbox's
/// backpressure) as long as it takes. Once `job_ended` turns true, a pipe that stays silent for
/// [`PIPE_IDLE_AFTER_END`] is abandoned: a process that left the job's group still holds it.
pub async fn read_stream(
    mut pipe: impl AsyncRead + Unpin,
    stream: Stream,
    to: mpsc::Sender<Piece>,
    mut job_ended: watch::Receiver<bool>,
) {
    let mut buf = vec![0u8; READ_BUFFER];
    loop {
        let read = if *job_ended.borrow_and_update() {
            match tokio::time::timeout(PIPE_IDLE_AFTER_END, pipe.read(&mut buf)).await {
                Ok(read) => read,
                Err(_idle) => {
                    tracing::warn!(
                        ?stream,
                        "a process outside the job's group keeps its output open; not reading further"
                    );
                    return;
                }
            }
        } else {
            // `read` is cancel-safe: losing the race reads nothing.
            tokio::select! {
                read = pipe.read(&mut buf) => read,
                _ = job_ended.changed() => continue,
            }
        };
        match read {
            Ok(0) => return,
            Ok(n) => {
                let piece = Piece {
                    stream,
                    bytes: buf[..n].to_vec(),
                };
                if to.send(piece).await.is_err() {
                    return;
                }
            }
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => {
                tracing::warn!(?stream, error = %e, "reading the job's output failed");
                return;
            }
        }
    }
}

/// Turns pieces into log events until every piece sender is gone; returns the next free `seq`.
pub async fn pump(
    mut pieces: mpsc::Receiver<Piece>,
    sink: EventSink,
    attempt: AttemptRef,
    mut seq: u64,
    window: Duration,
) -> u64 {
    let mut pending = Coalescer::default();
    let mut deadline: Option<Instant> = None;
    loop {
        let next = match deadline {
            Some(at) => match tokio::time::timeout_at(at, pieces.recv()).await {
                Ok(next) => next,
                Err(_elapsed) => {
                    seq = send_chunks(&mut pending, &sink, &attempt, seq).await;
                    deadline = None;
                    continue;
                }
            },
            None => pieces.recv().await,
        };
        let Some(piece) = next else {
            pending.finish();
            return send_chunks(&mut pending, &sink, &attempt, seq).await;
        };
        pending.push(piece.stream, &piece.bytes);
        if pending.bytes >= MAX_CHUNK_BYTES {
            seq = send_chunks(&mut pending, &sink, &attempt, seq).await;
            deadline = None;
        } else if deadline.is_none() && pending.bytes > 0 {
            deadline = Some(Instant::now() + window);
        }
    }
}

async fn send_chunks(
    pending: &mut Coalescer,
    sink: &EventSink,
    attempt: &AttemptRef,
    mut seq: u64,
) -> u64 {
    for (stream, data) in pending.drain_chunks() {
        // A closed sink means the agent is going away without its outbox; keep numbering so
        // the caller's sequence stays consistent.
        sink.send(AgentEvent::Log {
            attempt: attempt.clone(),
            seq,
            stream,
            data,
        })
        .await;
        seq += 1;
    }
    seq
}

/// Output waiting to be sent: runs of text per stream, in the order they were read.
#[derive(Debug, Default)]
pub struct Coalescer {
    segments: VecDeque<(Stream, String)>,
    bytes: usize,
    stdout: Utf8Carry,
    stderr: Utf8Carry,
}

impl Coalescer {
    pub fn push(&mut self, stream: Stream, bytes: &[u8]) {
        let text = self.carry(stream).decode(bytes);
        self.append(stream, text);
    }

    /// Ends both streams: an incomplete UTF-8 sequence left at the end is sent replaced.
    pub fn finish(&mut self) {
        for stream in [Stream::Stdout, Stream::Stderr] {
            let text = self.carry(stream).finish();
            self.append(stream, text);
        }
    }

    /// Everything pending as chunks of at most [`MAX_CHUNK_BYTES`], split on char boundaries.
    pub fn drain_chunks(&mut self) -> Vec<(Stream, String)> {
        let mut chunks = Vec::new();
        for (stream, mut text) in self.segments.drain(..) {
            while text.len() > MAX_CHUNK_BYTES {
                let mut cut = MAX_CHUNK_BYTES;
                while !text.is_char_boundary(cut) {
                    cut -= 1;
                }
                let rest = text.split_off(cut);
                chunks.push((stream, text));
                text = rest;
            }
            chunks.push((stream, text));
        }
        self.bytes = 0;
        chunks
    }

    fn carry(&mut self, stream: Stream) -> &mut Utf8Carry {
        match stream {
            Stream::Stderr => &mut self.stderr,
            Stream::Stdout | Stream::System => &mut self.stdout,
        }
    }

    fn append(&mut self, stream: Stream, text: String) {
        if text.is_empty() {
            return;
        }
        self.bytes += text.len();
        match self.segments.back_mut() {
            Some((last, run)) if *last == stream => run.push_str(&text),
            _ => self.segments.push_back((stream, text)),
        }
    }
}

/// Decodes one stream's bytes, holding back a UTF-8 sequence cut by a read boundary.
#[derive(Debug, Default)]
struct Utf8Carry {
    held: Vec<u8>,
}

impl Utf8Carry {
    fn decode(&mut self, bytes: &[u8]) -> String {
        self.held.extend_from_slice(bytes);
        let mut out = String::with_capacity(self.held.len());
        let mut rest: &[u8] = &self.held;
        loop {
            match std::str::from_utf8(rest) {
                Ok(valid) => {
                    out.push_str(valid);
                    rest = &[];
                    break;
                }
                Err(e) => {
                    let (valid, after) = rest.split_at(e.valid_up_to());
                    out.push_str(&String::from_utf8_lossy(valid));
                    match e.error_len() {
                        Some(bad) => {
                            out.push(char::REPLACEMENT_CHARACTER);
                            rest = &after[bad..];
                        }
                        None => {
                            rest = after;
                            break;
                        }
                    }
                }
            }
        }
        self.held = rest.to_vec();
        out
    }

    fn finish(&mut self) -> String {
        let out = String::from_utf8_lossy(&self.held).into_owned();
        self.held.clear();
        out
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use uuid::Uuid;

    #[test]
    fn utf8_split_across_reads_is_rejoined() {
        let mut c = Utf8Carry::default();
        let bytes = "héllo €".as_bytes();
        let (a, b) = bytes.split_at(2); // inside "é"
        assert_eq!(c.decode(a), "h");
        assert_eq!(c.decode(b), "éllo €");
        assert_eq!(c.decode(&[0xff, b'x']), "\u{FFFD}x");
        assert_eq!(c.decode(&[0xe2, 0x82]), "");
        assert_eq!(c.finish(), "\u{FFFD}");
    }

    #[test]
    fn chunks_are_capped_and_keep_stream_order() {
        let mut c = Coalescer::default();
        c.push(Stream::Stdout, b"a\n");
        c.push(Stream::Stdout, b"b\n");
        c.push(Stream::Stderr, b"oops\n");
        c.push(Stream::Stdout, "é".repeat(MAX_CHUNK_BYTES).as_bytes());
        let chunks = c.drain_chunks();
        assert_eq!(chunks[0], (Stream::Stdout, "a\nb\n".to_string()));
        assert_eq!(chunks[1], (Stream::Stderr, "oops\n".to_string()));
        assert!(chunks.iter().all(|(_, d)| d.len() <= MAX_CHUNK_BYTES));
        let big: String = chunks[2..].iter().map(|(_, d)| d.as_str()).collect();
        assert_eq!(big, "é".repeat(MAX_CHUNK_BYTES));
        assert_eq!(chunks.len(), 4);
        assert!(c.drain_chunks().is_empty());
    }

    fn attempt() -> AttemptRef {
        AttemptRef {
            job_id: Uuid::nil(),
            attempt_id: Uuid::nil(),
            epoch: 1,
        }
    }

    /// On a paused clock: output within the window is one chunk, later output another.
    #[tokio::test(start_paused = true)]
    async fn coalesces_within_the_window() {
        let (ptx, prx) = mpsc::channel(16);
        let (etx, mut erx) = EventSink::channel(16);
        let pump = tokio::spawn(pump(prx, etx, attempt(), 5, COALESCE_WINDOW));
        for line in ["1\n", "2\n", "3\n"] {
            ptx.send(Piece {
                stream: Stream::Stdout,
                bytes: line.into(),
            })
            .await
            .unwrap();
            tokio::time::sleep(Duration::from_millis(40)).await;
        }
        tokio::time::sleep(Duration::from_millis(300)).await;
        ptx.send(Piece {
            stream: Stream::Stdout,
            bytes: b"partial".to_vec(),
        })
        .await
        .unwrap();
        drop(ptx);
        assert_eq!(pump.await.unwrap(), 7);
        let mut got = Vec::new();
        while let Ok(e) = erx.try_recv() {
            if let AgentEvent::Log { seq, data, .. } = e {
                got.push((seq, data));
            }
        }
        assert_eq!(
            got,
            vec![(5, "1\n2\n3\n".to_string()), (6, "partial".to_string())]
        );
    }
}
