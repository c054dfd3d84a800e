//! The HTTP edge: accepts connections and serves them over HTTP/1.1, holding its own against
//! idle, slow and too many clients as if no proxy stood in front (docs/config.md, "The HTTP
//! edge").
//!
//! - **Timeouts.** A connection must send a request's head within the header-read timeout of
//!   connecting, and a keep-alive connection within it of the first byte after a pause; it may
//!   be silent between requests for the idle timeout; it must take an answer within the
//!   header-read timeout too. A handler is bounded by the request timeout (the router's layer).
//! - **A limit.** At most `connection_limit` connections are open (lowered at start to what the
//!   file descriptor limit leaves room for). When the ordinary slots are full, a new connection
//!   first makes room by closing the connection that has waited longest for a request, one
//!   that has not vouched for itself first (see below); at the limit with every connection
//!   handling a request, the listener waits and the kernel queues new connections.
//! - **Room kept.** The last eighth of the slots is reserved: a connection admitted there must
//!   vouch for itself — make an authenticated webhook delivery, an authenticated read API
//!   request or a health probe — within [`PROBATION`], or it is closed. So idle or slow
//!   clients cannot keep Telegram and the probes out.
//! - **Accept errors** (out of file descriptors) close the longest-waiting connection, back off
//!   and try again, without spinning or ending the service.
//!
//! Whatever it closes is counted and logged through [`Refusals`], a line per interval.

use std::collections::HashMap;
use std::convert::Infallible;
use std::future::Future;
use std::io;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::task::{Context, Poll};
use std::time::Duration;

use axum::Router;
use axum::body::Body;
use axum::http::Request;
use http_body_util::BodyExt;
use hyper::body::Incoming;
use hyper_util::rt::TokioIo;
use opledger_config::ServerConfig;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{Notify, watch};
use tokio::time::Instant;
use tower::ServiceExt;

use crate::refusals::{Refusal, Refusals};

/// How long a connection admitted into the reserved slots has to vouch for itself.
pub(crate) const PROBATION: Duration = Duration::from_secs(2);
/// File descriptors kept for everything but connections (the database, outgoing HTTP clients,
/// the runtime) when the limit is derived from `ulimit -n`.
const DESCRIPTORS_KEPT: u64 = 128;
/// How long a connection closed gracefully may take to finish writing before it is dropped.
const LINGER: Duration = Duration::from_secs(1);
/// The paths of health probes, which vouch for their connection.
const HEALTH_PROBES: [&str; 2] = ["/healthz", "/readyz"];
/// The first and the longest pause after a failed accept.
const ACCEPT_BACKOFF: (Duration, Duration) = (Duration::from_millis(10), Duration::from_secs(1));

/// The edge's limits, fixed at start.
#[derive(Debug, Clone)]
pub(crate) struct Limits {
    /// The most connections open at once.
    pub(crate) connections: usize,
    /// Of those, how many are reserved for connections that vouch for themselves.
    pub(crate) reserved: usize,
    pub(crate) header_read: Duration,
    pub(crate) idle: Duration,
}

impl Limits {
    /// The configured limits, the connection limit lowered to what the process's file
    /// descriptor limit leaves room for (with a warning when it is).
    pub(crate) fn new(server: &ServerConfig) -> Limits {
        let mut connections = server.connection_limit;
        if let Some(room) = descriptor_room()
            && room < connections
        {
            tracing::warn!(
                configured = connections,
                allowed = room,
                "[server] connection_limit lowered to what the file descriptor limit \
                 (`ulimit -n`) leaves room for; raise that limit (e.g. LimitNOFILE= in a systemd \
                 unit) to serve more connections"
            );
            connections = room;
        }
        Limits {
            connections,
            reserved: (connections / 8).max(2),
            header_read: server.header_read_timeout,
            idle: server.idle_timeout,
        }
    }

    /// Connections admitted beyond this many are on probation.
    fn ordinary(&self) -> usize {
        self.connections.saturating_sub(self.reserved)
    }
}

/// How many connections the soft file descriptor limit leaves room for, if it has one.
fn descriptor_room() -> Option<usize> {
    let soft = rustix::process::getrlimit(rustix::process::Resource::Nofile).current?;
    let room = if soft > 2 * DESCRIPTORS_KEPT {
        soft - DESCRIPTORS_KEPT
    } else {
        soft / 2
    };
    usize::try_from(room).ok().map(|room| room.max(2))
}

/// What a connection is doing.
#[derive(Debug, Clone, Copy)]
enum Phase {
    /// Waiting for a request's head: since when, and when its first byte came.
    Waiting {
        since: Instant,
        first_byte: Option<Instant>,
    },
    /// A handler has the request.
    Handling,
    /// The handler answered at `since`; the answer is being written.
    Answering { since: Instant },
}

#[derive(Debug)]
struct Activity {
    phase: Phase,
    /// Requests answered so far.
    served: u64,
}

/// One open connection, shared by its task, the table and (as [`Client`]) its requests.
#[derive(Debug)]
struct Connection {
    id: u64,
    peer: SocketAddr,
    accepted: Instant,
    /// Admitted into the reserved slots: closed unless it vouches for itself in time.
    reserved: bool,
    vouched: AtomicBool,
    evicted: AtomicBool,
    activity: Mutex<Activity>,
    /// Wakes the connection's task: a deadline may have moved closer, or it was evicted.
    wake: Notify,
}

/// Why and how a connection's task ends it.
#[derive(Debug, Clone, Copy)]
enum Ending {
    /// Drop it now, counted as this refusal (none for an ordinary idle timeout).
    Drop(Option<Refusal>),
    /// Let it finish writing what it has, then close it.
    Finish(Refusal),
}

impl Connection {
    fn activity(&self) -> MutexGuard<'_, Activity> {
        self.activity.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn is_waiting(&self) -> bool {
        matches!(self.activity().phase, Phase::Waiting { .. })
    }

    /// When it has waited since, if it is waiting for a request.
    fn waiting_since(&self) -> Option<Instant> {
        match self.activity().phase {
            Phase::Waiting { since, .. } => Some(since),
            _ => None,
        }
    }

    /// Bytes arrived: the first ones after a pause start the header-read timeout.
    fn bytes_arrived(&self) {
        let mut activity = self.activity();
        if let Phase::Waiting {
            first_byte: first @ None,
            ..
        } = &mut activity.phase
        {
            *first = Some(Instant::now());
            drop(activity);
            self.wake.notify_one();
        }
    }

    fn set_phase(&self, phase: Phase) {
        self.activity().phase = phase;
    }

    /// The answer was written (its body dropped): the connection waits for the next request.
    fn answered(&self) {
        {
            let mut activity = self.activity();
            activity.served += 1;
            activity.phase = Phase::Waiting {
                since: Instant::now(),
                first_byte: None,
            };
        }
        self.wake.notify_one();
    }

    /// When the connection's task must act next, and how; `None` while a handler runs.
    fn deadline(&self, limits: &Limits) -> Option<(Instant, Ending)> {
        let activity = self.activity();
        let unvouched = self.reserved && !self.vouched.load(Ordering::Relaxed);
        match activity.phase {
            Phase::Handling => None,
            Phase::Answering { since } => Some((
                since + limits.header_read,
                Ending::Drop(Some(Refusal::SlowReader)),
            )),
            Phase::Waiting { since, first_byte } => {
                if unvouched {
                    // Its request is answered (finish writing it, then close), or it has until
                    // the end of its probation to send one that vouches for it.
                    return Some(if activity.served > 0 {
                        (since, Ending::Finish(Refusal::Unvouched))
                    } else {
                        let end = (self.accepted + PROBATION).min(since + limits.header_read);
                        (end, Ending::Drop(Some(Refusal::Unvouched)))
                    });
                }
                let slow_head = Ending::Drop(Some(Refusal::SlowHead));
                Some(match first_byte {
                    _ if activity.served == 0 => (since + limits.header_read, slow_head),
                    Some(first) => (first + limits.header_read, slow_head),
                    None => (since + limits.idle, Ending::Drop(None)),
                })
            }
        }
    }
}

/// The connection a request came on, as handlers see it (a request extension): who the client
/// is, and the way for a handler to vouch for it.
#[derive(Debug, Clone)]
pub(crate) struct Client(Arc<Connection>);

impl Client {
    /// The client's address.
    pub(crate) fn address(&self) -> SocketAddr {
        self.0.peer
    }

    /// The request is an authenticated delivery or read, or a health probe: the connection may
    /// stay in a reserved slot.
    pub(crate) fn vouch(&self) {
        self.0.vouched.store(true, Ordering::Relaxed);
    }
}

/// The client address of a request, when it came through the edge.
pub(crate) fn client_address<B>(request: &Request<B>) -> Option<std::net::IpAddr> {
    request
        .extensions()
        .get::<Client>()
        .map(|client| client.address().ip())
}

/// Vouches for the connection a request came on, when it came through the edge.
pub(crate) fn vouch<B>(request: &Request<B>) {
    if let Some(client) = request.extensions().get::<Client>() {
        client.vouch();
    }
}

/// The open connections.
#[derive(Debug, Default)]
pub(crate) struct Connections {
    open: Mutex<HashMap<u64, Arc<Connection>>>,
    next_id: AtomicU64,
    /// A connection ended or began to wait for a request (room may have been made).
    changed: Notify,
}

impl Connections {
    fn open(&self) -> MutexGuard<'_, HashMap<u64, Arc<Connection>>> {
        self.open.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// How many connections are open.
    pub(crate) fn count(&self) -> usize {
        self.open().len()
    }

    /// Whether a new connection could be admitted: a slot is free, or one can be made.
    fn has_room(&self, limits: &Limits) -> bool {
        let open = self.open();
        open.len() < limits.connections || open.values().any(|c| c.is_waiting())
    }

    /// Waits until [`Connections::has_room`].
    async fn room(&self, limits: &Limits) {
        loop {
            let changed = self.changed.notified();
            tokio::pin!(changed);
            changed.as_mut().enable();
            if self.has_room(limits) {
                return;
            }
            changed.await;
        }
    }

    /// Closes the connection that has waited longest for a request, among those that have
    /// not vouched for themselves when `unvouched_only`; whether there was one.
    fn evict(open: &mut HashMap<u64, Arc<Connection>>, unvouched_only: bool) -> bool {
        let victim = open
            .values()
            .filter(|c| !unvouched_only || !c.vouched.load(Ordering::Relaxed))
            .filter_map(|c| c.waiting_since().map(|since| (since, c.id)))
            .min();
        let Some((_, id)) = victim else {
            return false;
        };
        if let Some(connection) = open.remove(&id) {
            connection.evicted.store(true, Ordering::Relaxed);
            connection.wake.notify_one();
        }
        true
    }

    /// Registers a new connection, making room first as the limits say; `None` if none could
    /// be made (the connection is closed).
    fn admit(&self, peer: SocketAddr, limits: &Limits) -> Option<Arc<Connection>> {
        let mut open = self.open();
        if open.len() >= limits.ordinary() {
            Self::evict(&mut open, true);
        }
        if open.len() >= limits.connections && !Self::evict(&mut open, false) {
            return None;
        }
        let connection = Arc::new(Connection {
            id: self.next_id.fetch_add(1, Ordering::Relaxed),
            peer,
            accepted: Instant::now(),
            reserved: open.len() >= limits.ordinary(),
            vouched: AtomicBool::new(false),
            evicted: AtomicBool::new(false),
            activity: Mutex::new(Activity {
                phase: Phase::Waiting {
                    since: Instant::now(),
                    first_byte: None,
                },
                served: 0,
            }),
            wake: Notify::new(),
        });
        open.insert(connection.id, connection.clone());
        Some(connection)
    }

    fn remove(&self, id: u64) {
        self.open().remove(&id);
        self.changed.notify_waiters();
    }

    /// Waits until every connection has ended.
    async fn drained(&self) {
        loop {
            let changed = self.changed.notified();
            tokio::pin!(changed);
            changed.as_mut().enable();
            if self.open().is_empty() {
                return;
            }
            changed.await;
        }
    }
}

/// What the accept loop and every connection's task share.
#[derive(Debug)]
pub(crate) struct Edge {
    pub(crate) limits: Limits,
    pub(crate) connections: Connections,
    pub(crate) refusals: Refusals,
}

impl Edge {
    pub(crate) fn new(server: &ServerConfig) -> Edge {
        Edge {
            limits: Limits::new(server),
            connections: Connections::default(),
            refusals: Refusals::default(),
        }
    }
}

/// Serves `router` on `listener` until `shutdown` resolves; then stops accepting, closes the
/// connections that wait for a request, lets the others finish their answer, and returns when
/// every connection has ended.
pub(crate) async fn serve(
    edge: Arc<Edge>,
    listener: TcpListener,
    router: Router,
    shutdown: impl Future<Output = ()>,
) {
    let (stop, stopping) = watch::channel(false);
    tokio::pin!(shutdown);
    let mut backoff = ACCEPT_BACKOFF.0;
    loop {
        let accepted = tokio::select! {
            () = &mut shutdown => break,
            accepted = async {
                edge.connections.room(&edge.limits).await;
                listener.accept().await
            } => accepted,
        };
        match accepted {
            Ok((stream, peer)) => {
                backoff = ACCEPT_BACKOFF.0;
                let Some(connection) = edge.connections.admit(peer, &edge.limits) else {
                    edge.refusals.note(Refusal::AtLimit, Some(peer.ip()), None);
                    continue;
                };
                let _ = stream.set_nodelay(true);
                tokio::spawn(run_connection(
                    edge.clone(),
                    connection,
                    stream,
                    router.clone(),
                    stopping.clone(),
                ));
            }
            Err(error) if is_connection_error(&error) => {}
            Err(error) => {
                edge.refusals
                    .note(Refusal::AcceptFailed, None, Some(&error.to_string()));
                // Out of descriptors: the connection that waited longest gives its back.
                {
                    let mut open = edge.connections.open();
                    if !Connections::evict(&mut open, true) {
                        Connections::evict(&mut open, false);
                    }
                }
                tokio::time::sleep(backoff).await;
                backoff = (backoff * 2).min(ACCEPT_BACKOFF.1);
            }
        }
    }
    drop(listener);
    let _ = stop.send(true);
    edge.connections.drained().await;
}

/// Errors of one connection that leave the listener fine.
fn is_connection_error(error: &io::Error) -> bool {
    matches!(
        error.kind(),
        io::ErrorKind::ConnectionRefused
            | io::ErrorKind::ConnectionAborted
            | io::ErrorKind::ConnectionReset
    )
}

/// Serves one connection under its deadlines until it ends, is closed or is evicted.
async fn run_connection(
    edge: Arc<Edge>,
    connection: Arc<Connection>,
    stream: TcpStream,
    router: Router,
    mut stopping: watch::Receiver<bool>,
) {
    let client = Client(connection.clone());
    let service = hyper::service::service_fn(move |request: Request<Incoming>| {
        let router = router.clone();
        let client = client.clone();
        async move {
            client.0.set_phase(Phase::Handling);
            if HEALTH_PROBES.contains(&request.uri().path()) {
                client.vouch();
            }
            let mut request = request.map(Body::new);
            request.extensions_mut().insert(client.clone());
            let response = match router.oneshot(request).await {
                Ok(response) => response,
                Err(never) => match never {},
            };
            client.0.set_phase(Phase::Answering {
                since: Instant::now(),
            });
            // The body is dropped once hyper has written all of it: then the connection waits.
            let written = Answered(client.0.clone());
            Ok::<_, Infallible>(response.map(move |body| {
                Body::new(body.map_frame(move |frame| {
                    let _ = &written;
                    frame
                }))
            }))
        }
    });
    let io = TokioIo::new(Watched {
        stream,
        connection: connection.clone(),
    });
    let http = hyper::server::conn::http1::Builder::new().serve_connection(io, service);
    tokio::pin!(http);
    let mut finishing: Option<Instant> = None;
    let mut stopped = *stopping.borrow();
    let address = Some(connection.peer.ip());
    loop {
        let deadline = match (connection.deadline(&edge.limits), finishing) {
            (_, Some(until)) => Some((until, Ending::Drop(None))),
            (deadline, None) => deadline,
        };
        let sleep = async {
            match deadline {
                Some((at, _)) => tokio::time::sleep_until(at).await,
                None => std::future::pending().await,
            }
        };
        tokio::select! {
            _ = http.as_mut() => break,
            () = connection.wake.notified() => {
                if connection.evicted.load(Ordering::Relaxed) {
                    edge.refusals.note(Refusal::Evicted, address, None);
                    break;
                }
            }
            () = sleep => {
                let Some((at, ending)) = deadline else { continue };
                if Instant::now() < at {
                    continue;
                }
                match ending {
                    Ending::Drop(refusal) => {
                        if let Some(refusal) = refusal {
                            edge.refusals.note(refusal, address, None);
                        }
                        break;
                    }
                    Ending::Finish(refusal) => {
                        edge.refusals.note(refusal, address, None);
                        http.as_mut().graceful_shutdown();
                        finishing = Some(Instant::now() + LINGER);
                    }
                }
            }
            changed = stopping.changed(), if !stopped => {
                stopped = true;
                if changed.is_err() || connection.is_waiting() {
                    break;
                }
                http.as_mut().graceful_shutdown();
            }
        }
    }
    edge.connections.remove(connection.id);
}

/// Marks the connection as waiting again when dropped with the answer's body.
struct Answered(Arc<Connection>);

impl Drop for Answered {
    fn drop(&mut self) {
        self.0.answered();
    }
}

/// A connection's stream, telling its [`Connection`] when bytes arrive.
struct Watched {
    stream: TcpStream,
    connection: Arc<Connection>,
}

impl AsyncRead for Watched {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let before = buf.filled().len();
        let polled = Pin::new(&mut self.stream).poll_read(cx, buf);
        if buf.filled().len() > before {
            self.connection.bytes_arrived();
        }
        polled
    }
}

impl AsyncWrite for Watched {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.stream).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.stream).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.stream.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.stream).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.stream).poll_shutdown(cx)
    }
}
