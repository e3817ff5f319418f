//! A connection with or without TLS, as one type, so that the code that
//! serves a port is written once.

use std::io;
use std::pin::Pin;
use std::task::{Context, Poll};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
use tokio::net::TcpStream;

type Tls = tokio_rustls::TlsStream<TcpStream>;

/// A TCP connection, plain or in TLS (either side).
#[derive(Debug)]
pub enum Stream {
    /// Plain TCP.
    Plain(TcpStream),
    /// TLS over TCP (boxed, as the halves are: its buffers make it large).
    Tls(Box<Tls>),
}

/// The reading half of a [`Stream`].
#[derive(Debug)]
pub enum ReadHalf {
    /// Plain TCP's own half (no lock between the halves).
    Plain(OwnedReadHalf),
    /// TLS's half (the halves share the connection's state).
    Tls(Box<tokio::io::ReadHalf<Tls>>),
}

/// The writing half of a [`Stream`].
#[derive(Debug)]
pub enum WriteHalf {
    /// Plain TCP's own half.
    Plain(OwnedWriteHalf),
    /// TLS's half.
    Tls(Box<tokio::io::WriteHalf<Tls>>),
}

impl Stream {
    /// Splits the connection into halves that a reader and a writer task
    /// own apart.
    pub fn into_split(self) -> (ReadHalf, WriteHalf) {
        match self {
            Stream::Plain(s) => {
                let (r, w) = s.into_split();
                (ReadHalf::Plain(r), WriteHalf::Plain(w))
            }
            Stream::Tls(s) => {
                let (r, w) = tokio::io::split(*s);
                (ReadHalf::Tls(Box::new(r)), WriteHalf::Tls(Box::new(w)))
            }
        }
    }

    /// Writes `bytes` and flushes them: TLS may keep the end of a write
    /// back until it is flushed (plain TCP keeps nothing).
    pub async fn send(&mut self, bytes: &[u8]) -> io::Result<()> {
        use tokio::io::AsyncWriteExt;
        self.write_all(bytes).await?;
        self.flush().await
    }

    /// The certificate the other end showed (DER), if it is in TLS and
    /// showed one.
    pub fn peer_certificate(&self) -> Option<Vec<u8>> {
        let Stream::Tls(tls) = self else { return None };
        let certs = match tls.as_ref() {
            tokio_rustls::TlsStream::Client(c) => c.get_ref().1.peer_certificates(),
            tokio_rustls::TlsStream::Server(s) => s.get_ref().1.peer_certificates(),
        };
        certs.and_then(|c| c.first()).map(|c| c.to_vec())
    }

    /// Whether the connection is in TLS.
    pub fn is_tls(&self) -> bool {
        matches!(self, Stream::Tls(_))
    }
}

/// Forwards a poll to whichever variant `$s` is.
macro_rules! either {
    ($s:expr, $inner:ident => $e:expr) => {
        match $s.get_mut() {
            Self::Plain($inner) => {
                let $inner = Pin::new($inner);
                $e
            }
            Self::Tls($inner) => {
                let $inner = Pin::new(&mut **$inner);
                $e
            }
        }
    };
}

/// Forwards `AsyncRead` to the variants.
macro_rules! readable {
    ($t:ty) => {
        impl AsyncRead for $t {
            fn poll_read(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
                either!(self, s => s.poll_read(cx, buf))
            }
        }
    };
}

/// Forwards `AsyncWrite` to the variants.
macro_rules! writable {
    ($t:ty) => {
        impl AsyncWrite for $t {
            fn poll_write(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<io::Result<usize>> {
                either!(self, s => s.poll_write(cx, buf))
            }

            fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
                either!(self, s => s.poll_flush(cx))
            }

            fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
                either!(self, s => s.poll_shutdown(cx))
            }

            fn poll_write_vectored(
                self: Pin<&mut Self>,
                cx: &mut Context<'_>,
                bufs: &[io::IoSlice<'_>],
            ) -> Poll<io::Result<usize>> {
                either!(self, s => s.poll_write_vectored(cx, bufs))
            }

            fn is_write_vectored(&self) -> bool {
                match self {
                    Self::Plain(s) => s.is_write_vectored(),
                    Self::Tls(s) => s.is_write_vectored(),
                }
            }
        }
    };
}

readable!(Stream);
writable!(Stream);
readable!(ReadHalf);
writable!(WriteHalf);
