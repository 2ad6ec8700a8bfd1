//! How many tests run against the server at once, and which run alone among
//! the heavy ones.
//!
//! The suite runs several tests at a time (`RUST_TEST_THREADS` in
//! `.cargo/config.toml`): most of a test's time is spent waiting on a
//! database, a relay or a socket, so two cores are not the limit. The server's
//! `max_connections` is: a test that starts `serve` and a relay holds a few
//! dozen connections. So each test that takes a database takes a seat first,
//! and the seats are what the server can hold: on PostgreSQL's default of
//! 100, three tests at once; on the 300 that `.ci/run` sets, as many as there
//! are test threads. A test whose connections are not a [`TestDb`]'s (the
//! bench's scratch database) takes a seat of its size.
//!
//! A heavy test (a million rows, a thousand deliveries, thousands of sockets)
//! also takes a heavy seat. One that bounds a time (a page under a second, a
//! delivery within a probe's wait) takes them all, so that no other heavy
//! test shares the machine with it: its bounds are about our code, not
//! about its neighbours, which alone can double a fairness test's p99. One
//! that only loads the machine and checks counts (exactly once, every job
//! done) is [`loud`], and two of those may run at once: one alone leaves a
//! core idle for much of its run.

use std::collections::HashMap;
use std::sync::{Condvar, Mutex, OnceLock};
use std::thread::ThreadId;

use diesel::prelude::*;
use diesel::sql_types::Text;

/// Connections one test may hold: `serve`'s pool, a relay's pool and its
/// listener, and the test's own (31 at the most, sampled from
/// pg_stat_activity over a whole run).
pub const CONNECTIONS_PER_TEST: usize = 30;
/// Loud tests at once; a heavy test that bounds a time takes them all.
const HEAVY_SEATS: usize = 2;
/// Left for psql, the template's build and whatever else the server serves.
const RESERVED: usize = 10;

/// Seats taken, by the test thread that took them (a test that makes two
/// databases sits once), and how many heavy tests run.
#[derive(Default)]
struct Taken {
    /// Seats held and the connections they stand for, by thread.
    by_thread: HashMap<ThreadId, (usize, usize)>,
    heavy: usize,
    /// The thread of a test measuring times, which no new test sits beside.
    quiet: Option<ThreadId>,
}

static TAKEN: Mutex<Option<Taken>> = Mutex::new(None);
static FREED: Condvar = Condvar::new();

/// `TEST_TIMELINE=FILE` writes when each test waits for and takes its seats,
/// a line each, to see where a run's wall time goes.
fn timeline(event: &str) {
    static FILE: OnceLock<Option<(std::time::Instant, Mutex<std::fs::File>)>> = OnceLock::new();
    let file = FILE.get_or_init(|| {
        let path = std::env::var_os("TEST_TIMELINE")?;
        let file = std::fs::File::create(path).ok()?;
        Some((std::time::Instant::now(), Mutex::new(file)))
    });
    if let Some((start, file)) = file {
        use std::io::Write as _;
        let thread = std::thread::current();
        let line = format!(
            "{:.3} {} {}\n",
            start.elapsed().as_secs_f64(),
            event,
            thread.name().unwrap_or("?")
        );
        let _ = file
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .write_all(line.as_bytes());
    }
}

fn lock() -> std::sync::MutexGuard<'static, Option<Taken>> {
    TAKEN.lock().unwrap_or_else(|e| e.into_inner())
}

/// Connections the tests may hold at once.
fn budget(conn: &mut PgConnection) -> usize {
    static BUDGET: OnceLock<usize> = OnceLock::new();
    *BUDGET.get_or_init(|| {
        #[derive(QueryableByName)]
        struct Setting {
            #[diesel(sql_type = Text)]
            max_connections: String,
        }
        let max = diesel::sql_query("SHOW max_connections")
            .get_result::<Setting>(conn)
            .ok()
            .and_then(|s| s.max_connections.parse::<usize>().ok())
            .unwrap_or(100);
        max.saturating_sub(RESERVED)
    })
}

/// A seat at the server, held until dropped (by the [`TestDb`](super::TestDb)
/// that took it), on whichever thread.
#[derive(Debug)]
pub struct Seat {
    thread: ThreadId,
}

impl Seat {
    /// Waits for a seat, unless this test's thread already holds one.
    pub fn take(conn: &mut PgConnection) -> Seat {
        Seat::for_connections(conn, CONNECTIONS_PER_TEST)
    }

    /// Waits until `connections` more fit under the server's limit, unless
    /// this test's thread already holds a seat. A test that holds none is
    /// always let in, however many it asks for.
    pub fn for_connections(conn: &mut PgConnection, connections: usize) -> Seat {
        let budget = budget(conn);
        let thread = std::thread::current().id();
        timeline("seat-wait");
        let mut taken = lock();
        loop {
            let state = taken.get_or_insert_with(Taken::default);
            let held: usize = state.by_thread.values().map(|&(_, c)| c).sum();
            if let Some(seat) = state.by_thread.get_mut(&thread) {
                seat.0 += 1;
                return Seat { thread };
            }
            let hushed = state.quiet.is_some_and(|quiet| quiet != thread);
            if !hushed && (state.by_thread.is_empty() || held + connections <= budget) {
                state.by_thread.insert(thread, (1, connections));
                timeline("seated");
                return Seat { thread };
            }
            taken = FREED.wait(taken).unwrap_or_else(|e| e.into_inner());
        }
    }
}

impl Drop for Seat {
    fn drop(&mut self) {
        let mut taken = lock();
        let state = taken.get_or_insert_with(Taken::default);
        if let Some(held) = state.by_thread.get_mut(&self.thread) {
            held.0 -= 1;
            if held.0 == 0 {
                state.by_thread.remove(&self.thread);
                timeline("unseated");
            }
        }
        let last = state.by_thread.is_empty();
        FREED.notify_all();
        drop(taken);
        // Every seated test has put its ended databases in the list before
        // leaving its seat, so the last to leave takes them all: a run that
        // is over leaves nothing behind.
        if last {
            super::db::drop_ended();
        }
    }
}

/// A heavy test's seats, held until dropped.
#[derive(Debug)]
pub struct Heavy(usize);

/// A loud test's seat, held until dropped.
#[derive(Debug)]
pub struct Loud {
    _seat: Heavy,
}

/// Every heavy seat: for a heavy test that bounds a time.
pub fn heavy() -> Heavy {
    take_heavy(HEAVY_SEATS)
}

/// One heavy seat: for a heavy test that bounds no time, only counts.
pub fn loud() -> Loud {
    Loud {
        _seat: take_heavy(1),
    }
}

fn take_heavy(seats: usize) -> Heavy {
    timeline("heavy-wait");
    let mut taken = lock();
    while taken.get_or_insert_with(Taken::default).heavy + seats > HEAVY_SEATS {
        taken = FREED.wait(taken).unwrap_or_else(|e| e.into_inner());
    }
    taken.get_or_insert_with(Taken::default).heavy += seats;
    timeline("heavy");
    Heavy(seats)
}

impl Drop for Heavy {
    fn drop(&mut self) {
        let mut taken = lock();
        let state = taken.get_or_insert_with(Taken::default);
        state.heavy = state.heavy.saturating_sub(self.0);
        timeline("heavy-end");
        drop(taken);
        FREED.notify_all();
    }
}

/// The machine to one test while it measures: no test takes a seat until
/// this is dropped, and it is handed out once every other test holding one
/// has ended. For the few seconds a test times its pages or its calls
/// against a bound: beside other tests on two cores a page can take twice
/// its time, and a statement can run into the dashboard's timeout. The
/// heavy seats it is given for (all of them, taken before any database)
/// prove that no other test waits for quiet while holding a seat this one
/// would wait for.
#[derive(Debug)]
pub struct Quiet(());

pub fn quiet(_heavy: &Heavy) -> Quiet {
    let thread = std::thread::current().id();
    timeline("quiet-wait");
    let mut taken = lock();
    taken.get_or_insert_with(Taken::default).quiet = Some(thread);
    // The longest test ends well within this; a seat taken on another
    // thread than the test's own would never leave, and fails here.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(180);
    loop {
        let state = taken.get_or_insert_with(Taken::default);
        let others = state
            .by_thread
            .keys()
            .filter(|held| **held != thread)
            .count();
        if others == 0 {
            timeline("quiet");
            return Quiet(());
        }
        let left = deadline.saturating_duration_since(std::time::Instant::now());
        assert!(
            !left.is_zero(),
            "{others} other tests still seated after 180 s"
        );
        taken = FREED
            .wait_timeout(taken, left)
            .unwrap_or_else(|e| e.into_inner())
            .0;
    }
}

impl Drop for Quiet {
    fn drop(&mut self) {
        let mut taken = lock();
        taken.get_or_insert_with(Taken::default).quiet = None;
        timeline("quiet-end");
        drop(taken);
        FREED.notify_all();
    }
}

/// A seat for a test whose child process makes its own scratch database
/// (`bench`, `demo`) and holds about `connections` of the server's.
pub fn scratch(connections: usize) -> Seat {
    let url = super::db::admin_url();
    let mut conn = PgConnection::establish(&url).unwrap_or_else(|e| {
        panic!(
            "cannot connect to {}: {e}",
            order_service::db::redact_url(&url)
        )
    });
    Seat::for_connections(&mut conn, connections)
}
