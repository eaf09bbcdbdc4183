//! A guest's stdout or stderr: kept in memory and taken after each call.
//!
//! wasmtime's `MemoryOutputPipe` can only be read whole (`contents` copies everything written
//! since the instance started), so a plugin that prints a line per task made every call copy all
//! it had printed before: up to half a megabyte per call before its instance was recycled. This
//! pipe hands over only what was written since the last [`GuestOutput::take`], without a copy.
//!
//! The bound is as before: an instance may write at most `capacity` bytes over its life (a write
//! past it traps the call, naming the limit), and [`GuestOutput::written`] tells the caller when
//! to recycle the instance.

use std::pin::Pin;
use std::sync::{Arc, Mutex, MutexGuard};
use std::task::{Context, Poll};

use bytes::{Bytes, BytesMut};
use tokio::io::AsyncWrite;
use wasmtime_wasi::cli::{IsTerminal, StdoutStream};
use wasmtime_wasi::p2::{OutputStream, Pollable, StreamError};

#[derive(Default)]
struct Buffer {
    /// Written since the last take.
    new: BytesMut,
    /// Written over the instance's life.
    written: usize,
}

/// An in-memory output stream for one instance; clones share the buffer.
#[derive(Clone)]
pub(super) struct GuestOutput {
    capacity: usize,
    buf: Arc<Mutex<Buffer>>,
}

impl GuestOutput {
    pub(super) fn new(capacity: usize) -> GuestOutput {
        GuestOutput {
            capacity,
            buf: Arc::default(),
        }
    }

    fn lock(&self) -> MutexGuard<'_, Buffer> {
        self.buf.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// What was written since the last take (no copy).
    pub(super) fn take(&self) -> Bytes {
        self.lock().new.split().freeze()
    }

    /// Bytes written over the instance's life.
    pub(super) fn written(&self) -> usize {
        self.lock().written
    }

    fn over(&self) -> StreamError {
        StreamError::Trap(wasmtime::format_err!(
            "the plugin wrote more than {} bytes to stdout or stderr",
            self.capacity
        ))
    }

    /// Appends up to `bytes.len()` bytes within the capacity; returns how many.
    fn append(&self, bytes: &[u8], all_or_nothing: bool) -> Option<usize> {
        let mut b = self.lock();
        let room = self.capacity - b.written;
        if all_or_nothing && bytes.len() > room {
            return None;
        }
        let n = bytes.len().min(room);
        b.new.extend_from_slice(&bytes[..n]);
        b.written += n;
        Some(n)
    }
}

#[wasmtime_wasi::async_trait]
impl OutputStream for GuestOutput {
    fn write(&mut self, bytes: Bytes) -> Result<(), StreamError> {
        match self.append(&bytes, true) {
            Some(_) => Ok(()),
            None => Err(self.over()),
        }
    }

    fn flush(&mut self) -> Result<(), StreamError> {
        Ok(())
    }

    /// Full: a trap that names the limit (a closed stream would reach the guest as a bare
    /// "broken pipe").
    fn check_write(&mut self) -> Result<usize, StreamError> {
        let written = self.written();
        if written < self.capacity {
            Ok(self.capacity - written)
        } else {
            Err(self.over())
        }
    }
}

#[wasmtime_wasi::async_trait]
impl Pollable for GuestOutput {
    async fn ready(&mut self) {}
}

impl AsyncWrite for GuestOutput {
    fn poll_write(
        self: Pin<&mut Self>,
        _cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        Poll::Ready(Ok(self.append(buf, false).unwrap_or(0)))
    }

    fn poll_flush(self: Pin<&mut Self>, _cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Poll::Ready(Ok(()))
    }

    fn poll_shutdown(self: Pin<&mut Self>, _cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Poll::Ready(Ok(()))
    }
}

impl IsTerminal for GuestOutput {
    fn is_terminal(&self) -> bool {
        false
    }
}

impl StdoutStream for GuestOutput {
    fn p2_stream(&self) -> Box<dyn OutputStream> {
        Box::new(self.clone())
    }

    fn async_stream(&self) -> Box<dyn AsyncWrite + Send + Sync> {
        Box::new(self.clone())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn take_hands_over_only_what_is_new_and_the_capacity_counts_the_whole_life() {
        let mut out = GuestOutput::new(10);
        out.write(Bytes::from_static(b"abc")).unwrap();
        assert_eq!(&out.take()[..], b"abc");
        out.write(Bytes::from_static(b"defg")).unwrap();
        assert_eq!(&out.take()[..], b"defg");
        assert!(out.take().is_empty());
        assert_eq!(out.written(), 7);
        assert_eq!(out.check_write().unwrap(), 3);
        // past the capacity over the life: a trap that names the limit
        let e = out.write(Bytes::from_static(b"hijk")).unwrap_err();
        assert!(e.to_string().contains("more than 10 bytes"), "{e}");
        out.write(Bytes::from_static(b"hij")).unwrap();
        let e = out.check_write().unwrap_err();
        assert!(e.to_string().contains("more than 10 bytes"), "{e}");
        assert_eq!(&out.take()[..], b"hij");
    }
}
