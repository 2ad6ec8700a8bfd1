//! Every open connection of a listener, and which of them may be dropped to
//! make room.
//!
//! A connection is *idle* from when it opens until its request head is in,
//! and again from when its response has been handed to the socket until the
//! next head is in: it holds a slot while doing no work, which is all a
//! half-open or slow-header client does. At the cap the oldest idle
//! connection is evicted to let a new one in, so a flood of them churns
//! among itself while a client that sends its request at once is served.
//! A connection with a request in flight is never evicted, nor one whose
//! response is still being written (a slow reader downloading a receipt; the
//! write timeout bounds it); when no slot is free, new clients wait in the
//! accept backlog as before.

use std::collections::{BTreeMap, HashMap};
use std::net::IpAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;

use crate::client_addr::{TrustedProxies, client_key};

/// One open connection, as its task and its service see it.
#[derive(Debug)]
pub(super) struct Connection {
    id: u64,
    addr: IpAddr,
    /// Cancelled when the connection is evicted: its task closes it.
    pub evicted: CancellationToken,
    /// A write to the socket is waiting for the client: not evictable.
    writing: Arc<AtomicBool>,
    registry: Arc<Registry>,
}

impl Connection {
    /// Called by the socket's writer when a write starts waiting for the
    /// client (`true`) and when it gets through (`false`).
    pub fn set_writing(&self, writing: bool) {
        let was = self.writing.swap(writing, Ordering::Relaxed);
        if was && !writing {
            self.registry.room.notify_waiters();
        }
    }

    /// Its request head is in: not evictable until [`Busy`] is dropped.
    pub fn busy(self: &Arc<Self>) -> Busy {
        let mut state = self.registry.lock();
        let mut was_idle = None;
        if let Some(entry) = state.open.get_mut(&self.id) {
            entry.in_flight += 1;
            was_idle = entry.idle_since.take();
        }
        if let Some(seq) = was_idle {
            state.idle.remove(&seq);
            if let Some(addr) = state.addrs.get_mut(&self.addr) {
                addr.idle.remove(&seq);
            }
        }
        Busy(Arc::clone(self))
    }
}

impl Drop for Connection {
    fn drop(&mut self) {
        self.registry.close(self.id);
    }
}

/// A request in flight on a connection; dropped once its response has been
/// handed to the socket, when the connection is idle again.
#[derive(Debug)]
pub(super) struct Busy(Arc<Connection>);

impl Drop for Busy {
    fn drop(&mut self) {
        let connection = &self.0;
        let mut state = connection.registry.lock();
        let done = state.open.get_mut(&connection.id).is_some_and(|entry| {
            entry.in_flight = entry.in_flight.saturating_sub(1);
            entry.in_flight == 0
        });
        if done {
            state.mark_idle(connection.id, connection.addr);
        }
        drop(state);
        connection.registry.room.notify_waiters();
    }
}

#[derive(Debug)]
struct Entry {
    addr: IpAddr,
    /// When it last became idle (a sequence number, so ties cannot happen);
    /// `None` while a request is in flight.
    idle_since: Option<u64>,
    /// Requests whose response is not yet handed to the socket.
    in_flight: usize,
    evicted: CancellationToken,
    writing: Arc<AtomicBool>,
}

#[derive(Debug, Default)]
struct PerAddr {
    open: usize,
    /// Idle connections from this address: sequence → connection id.
    idle: BTreeMap<u64, u64>,
}

#[derive(Debug, Default)]
struct State {
    next_id: u64,
    next_seq: u64,
    open: HashMap<u64, Entry>,
    /// Every idle connection, oldest first: sequence → connection id.
    idle: BTreeMap<u64, u64>,
    addrs: HashMap<IpAddr, PerAddr>,
    evictions: u64,
}

impl State {
    /// The longest-idle connection among `idle` that is not writing.
    fn evictable(&self, idle: &BTreeMap<u64, u64>) -> Option<u64> {
        idle.values().copied().find(|id| {
            self.open
                .get(id)
                .is_some_and(|e| !e.writing.load(Ordering::Relaxed))
        })
    }

    fn mark_idle(&mut self, id: u64, addr: IpAddr) {
        let seq = self.next_seq;
        self.next_seq += 1;
        if let Some(entry) = self.open.get_mut(&id) {
            entry.idle_since = Some(seq);
            self.idle.insert(seq, id);
            if let Some(per) = self.addrs.get_mut(&addr) {
                per.idle.insert(seq, id);
            }
        }
    }

    /// Forgets connection `id` (closed, or evicted: its slot is free now,
    /// though its socket closes a moment later).
    fn remove(&mut self, id: u64) -> Option<Entry> {
        let entry = self.open.remove(&id)?;
        if let Some(seq) = entry.idle_since {
            self.idle.remove(&seq);
        }
        if let Some(per) = self.addrs.get_mut(&entry.addr) {
            per.open -= 1;
            if let Some(seq) = entry.idle_since {
                per.idle.remove(&seq);
            }
            if per.open == 0 {
                self.addrs.remove(&entry.addr);
            }
        }
        Some(entry)
    }

    fn evict(&mut self, id: u64) {
        if let Some(entry) = self.remove(id) {
            entry.evicted.cancel();
            self.evictions += 1;
        }
    }
}

/// What to do with a connection just accepted.
#[derive(Debug)]
pub(super) enum Admission {
    Admitted(Arc<Connection>),
    /// Its address is at its cap with nothing idle to give up: closed at once.
    Refused,
    /// Every slot has a request in flight: wait for [`Registry::room`] and
    /// ask again.
    Full,
}

/// The open connections of one listener.
#[derive(Debug)]
pub(super) struct Registry {
    max_connections: usize,
    /// 0: no per-address cap.
    max_per_address: usize,
    /// Never capped per address besides loopback: the trusted proxies, whose
    /// one address every client behind them shares.
    uncapped: TrustedProxies,
    state: Mutex<State>,
    /// Woken when a slot frees or a connection becomes evictable.
    room: Notify,
}

impl Registry {
    pub fn new(
        max_connections: usize,
        max_per_address: usize,
        uncapped: TrustedProxies,
    ) -> Arc<Registry> {
        Arc::new(Registry {
            max_connections: max_connections.max(1),
            max_per_address,
            uncapped,
            state: Mutex::new(State::default()),
            room: Notify::new(),
        })
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Returns once a new connection can be taken in: a slot is free, or an
    /// idle connection can be evicted for it.
    pub async fn room(&self) {
        loop {
            let notified = self.room.notified();
            let mut notified = std::pin::pin!(notified);
            notified.as_mut().enable();
            {
                let state = self.lock();
                if state.open.len() < self.max_connections || state.evictable(&state.idle).is_some()
                {
                    return;
                }
            }
            notified.await;
        }
    }

    /// Takes in a connection from `addr`, evicting the oldest idle one when a
    /// cap is reached: that address's own first (so one client churns its own
    /// connections, not others'), then anyone's.
    pub fn admit(self: &Arc<Self>, peer: IpAddr) -> Admission {
        let capped = self.max_per_address > 0
            && !client_key(peer).is_loopback()
            && !peer.is_loopback()
            && !self.uncapped.contains(peer);
        // An IPv6 client counts by its /64, as the per-address request limit.
        let addr = client_key(peer);
        let mut state = self.lock();
        if capped {
            let per = state.addrs.get(&addr);
            if per.is_some_and(|p| p.open >= self.max_per_address) {
                let oldest = per.and_then(|p| state.evictable(&p.idle));
                match oldest {
                    Some(id) => state.evict(id),
                    None => return Admission::Refused,
                }
            }
        }
        if state.open.len() >= self.max_connections {
            match state.evictable(&state.idle) {
                Some(id) => state.evict(id),
                None => return Admission::Full,
            }
        }
        let id = state.next_id;
        state.next_id += 1;
        let evicted = CancellationToken::new();
        let writing = Arc::new(AtomicBool::new(false));
        state.open.insert(
            id,
            Entry {
                addr,
                idle_since: None,
                in_flight: 0,
                evicted: evicted.clone(),
                writing: Arc::clone(&writing),
            },
        );
        state.addrs.entry(addr).or_default().open += 1;
        state.mark_idle(id, addr);
        Admission::Admitted(Arc::new(Connection {
            id,
            addr,
            evicted,
            writing,
            registry: Arc::clone(self),
        }))
    }

    fn close(&self, id: u64) {
        self.lock().remove(id);
        self.room.notify_waiters();
    }

    /// Connections open now.
    pub fn open(&self) -> usize {
        self.lock().open.len()
    }

    /// Connections evicted so far.
    pub fn evictions(&self) -> u64 {
        self.lock().evictions
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ip(last: u8) -> IpAddr {
        IpAddr::from([192, 0, 2, last])
    }

    fn admitted(registry: &Arc<Registry>, addr: IpAddr) -> Arc<Connection> {
        match registry.admit(addr) {
            Admission::Admitted(c) => c,
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn at_the_cap_the_oldest_idle_connection_is_evicted_and_busy_ones_never() {
        let registry = Registry::new(3, 0, TrustedProxies::default());
        let first = admitted(&registry, ip(1));
        let second = admitted(&registry, ip(1));
        let third = admitted(&registry, ip(2));
        let _busy = first.busy();

        let fourth = admitted(&registry, ip(3));
        assert!(!first.evicted.is_cancelled(), "busy: never evicted");
        let (_b3, _b4) = (third.busy(), fourth.busy());
        assert!(
            matches!(registry.admit(ip(4)), Admission::Full),
            "every slot busy: the new one waits"
        );
        assert!(second.evicted.is_cancelled(), "the oldest idle one");
        assert!(!third.evicted.is_cancelled());
        assert_eq!(registry.open(), 3);
        assert_eq!(registry.evictions(), 1);
        drop((_b3, _b4, second, third, fourth));
        assert_eq!(registry.open(), 1);
    }

    #[test]
    fn a_connection_idle_again_after_its_response_is_newer_than_the_flood() {
        let registry = Registry::new(2, 0, TrustedProxies::default());
        let keep_alive = admitted(&registry, ip(1));
        let squatter = admitted(&registry, ip(2));
        drop(keep_alive.busy());
        // keep_alive is idle again, but more recently than the squatter.
        let _new = admitted(&registry, ip(3));
        assert!(squatter.evicted.is_cancelled());
        assert!(!keep_alive.evicted.is_cancelled());
    }

    #[test]
    fn a_connection_still_writing_its_response_is_not_evicted() {
        let registry = Registry::new(2, 0, TrustedProxies::default());
        let downloading = admitted(&registry, ip(1));
        let squatter = admitted(&registry, ip(2));
        drop(squatter.busy());
        downloading.set_writing(true);
        let new = admitted(&registry, ip(3));
        let _busy = new.busy();
        assert!(!downloading.evicted.is_cancelled());
        assert!(squatter.evicted.is_cancelled());
        assert!(matches!(registry.admit(ip(4)), Admission::Full));
        downloading.set_writing(false);
        assert!(matches!(registry.admit(ip(4)), Admission::Admitted(_)));
    }

    #[tokio::test]
    async fn when_every_slot_is_busy_there_is_no_room_until_one_frees() {
        let registry = Registry::new(1, 0, TrustedProxies::default());
        let only = admitted(&registry, ip(1));
        let busy = only.busy();
        let waiting = tokio::spawn({
            let registry = Arc::clone(&registry);
            async move { registry.room().await }
        });
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
        assert!(!waiting.is_finished());
        drop(busy);
        tokio::time::timeout(std::time::Duration::from_secs(1), waiting)
            .await
            .expect("room once the connection is idle")
            .expect("task");
    }

    #[test]
    fn at_its_own_cap_an_address_evicts_its_own_oldest_idle_connection_first() {
        let registry = Registry::new(10, 2, TrustedProxies::default());
        let victim = admitted(&registry, ip(9));
        let a = admitted(&registry, ip(1));
        let b = admitted(&registry, ip(1));
        let _c = admitted(&registry, ip(1));
        assert!(a.evicted.is_cancelled());
        assert!(!b.evicted.is_cancelled());
        assert!(
            !victim.evicted.is_cancelled(),
            "another address is left alone"
        );
        // Both of its connections busy: the address is refused.
        let _busy_b = b.busy();
        let _busy_c = _c.busy();
        assert!(matches!(registry.admit(ip(1)), Admission::Refused));
        assert!(matches!(registry.admit(ip(2)), Admission::Admitted(_)));
    }

    #[test]
    fn loopback_and_trusted_proxies_are_never_capped_per_address() {
        let proxies = TrustedProxies::parse("10.0.0.0/8").expect("valid");
        let registry = Registry::new(100, 1, proxies);
        let mut held = Vec::new();
        for addr in [
            IpAddr::from([127, 0, 0, 1]),
            "::1".parse().expect("IP"),
            IpAddr::from([10, 1, 2, 3]),
        ] {
            for _ in 0..5 {
                let connection = admitted(&registry, addr);
                held.push(connection.busy());
                held.push(connection.busy());
            }
        }
        let first = admitted(&registry, ip(1));
        let _busy = first.busy();
        assert!(matches!(registry.admit(ip(1)), Admission::Refused));
    }

    #[test]
    fn an_ipv6_client_is_capped_by_its_64() {
        let registry = Registry::new(100, 1, TrustedProxies::default());
        let first = admitted(&registry, "2001:db8:1:2::1".parse().expect("IP"));
        let _busy = first.busy();
        assert!(matches!(
            registry.admit("2001:db8:1:2::99".parse().expect("IP")),
            Admission::Refused
        ));
        assert!(matches!(
            registry.admit("2001:db8:1:3::1".parse().expect("IP")),
            Admission::Admitted(_)
        ));
    }
}
