//! Two PostgreSQL servers on this machine, one the primary and one its
//! streaming standby, from the server programs the private server uses
//! (`initdb`, `pg_basebackup -R`, `pg_ctl`), on their own ports. As root they
//! run as the `postgres` user, since initdb refuses root.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

use diesel::prelude::*;
use diesel::sql_types::Text;
use outbox_dev_tools::private_pg::find_bindir;

/// Replication mode of the standby.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Replication {
    /// `synchronous_standby_names = '*'`: a commit is acknowledged once the
    /// standby has it.
    Sync,
    /// The default: a commit is acknowledged before the standby has it.
    Async,
}

#[derive(Debug)]
pub struct Cluster {
    root: PathBuf,
    bindir: PathBuf,
    run_as: Option<String>,
    ports: [u16; 2],
    replication: Replication,
    /// Index (0 or 1) of the node that is the primary now.
    primary: usize,
}

#[derive(QueryableByName)]
struct State {
    #[diesel(sql_type = Text)]
    state: String,
}

/// Where a cluster's files go: `/dev/shm` when the machine has a tmpfs
/// there, else the target directory. initdb and pg_basebackup make some
/// 2,000 files per cluster, deleted when its test ends, and on ext4 without a
/// journal that churn costs CPU of its own (see `support::db::TABLESPACE`).
/// A failed test's cluster is kept for its logs, wherever it is.
fn scratch_root() -> PathBuf {
    let on_tmpfs = std::fs::read_to_string("/proc/mounts").is_ok_and(|mounts| {
        mounts.lines().any(|line| {
            let mut fields = line.split_whitespace().skip(1);
            fields.next() == Some("/dev/shm") && fields.next() == Some("tmpfs")
        })
    });
    if on_tmpfs {
        PathBuf::from("/dev/shm")
    } else {
        PathBuf::from(env!("CARGO_TARGET_TMPDIR"))
    }
}

impl Cluster {
    /// Node 0 the primary, node 1 its standby, streaming in `replication` mode.
    pub fn start(replication: Replication) -> Cluster {
        let bindir = find_bindir().expect("PostgreSQL's server programs (initdb, pg_ctl)");
        let root = scratch_root().join(format!(
            "failover-{}-{:08x}",
            std::process::id(),
            fastrand::u32(..)
        ));
        std::fs::create_dir_all(&root).expect("create the cluster directory");
        let run_as = run_as();
        if let Some(user) = &run_as {
            let status = Command::new("chown")
                .arg(format!("{user}:"))
                .arg(&root)
                .status()
                .expect("chown");
            assert!(status.success(), "chown {}", root.display());
        }
        let cluster = Cluster {
            root,
            bindir,
            run_as,
            ports: [free_port(), free_port()],
            replication,
            primary: 0,
        };
        let data = path_str(&cluster.data(0));
        cluster.run(
            "initdb",
            &[
                "-D",
                &data,
                "-U",
                "postgres",
                "-A",
                "trust",
                "-E",
                "UTF8",
                "--locale=C",
                "--no-sync",
            ],
        );
        cluster.configure(0);
        cluster.pg_ctl_start(0);
        cluster.rebuild_standby(1);
        cluster
    }

    /// `DATABASE_URL` naming both servers, as a failover needs.
    pub fn url(&self) -> String {
        format!(
            "postgres://postgres@127.0.0.1:{},127.0.0.1:{}/postgres?target_session_attrs=read-write",
            self.ports[0], self.ports[1]
        )
    }

    /// The URL of the current primary alone.
    pub fn primary_url(&self) -> String {
        self.node_url(self.primary)
    }

    fn node_url(&self, node: usize) -> String {
        format!(
            "postgres://postgres@127.0.0.1:{}/postgres",
            self.ports[node]
        )
    }

    /// The standby now.
    fn standby(&self) -> usize {
        1 - self.primary
    }

    /// Stops the primary at once, as a crash would (`pg_ctl stop -m immediate`).
    pub fn crash_primary(&self) {
        let data = path_str(&self.data(self.primary));
        self.run("pg_ctl", &["-D", &data, "-m", "immediate", "-w", "stop"]);
    }

    /// Promotes the standby; from now on it is the primary.
    pub fn promote_standby(&mut self) {
        let standby = self.standby();
        let data = path_str(&self.data(standby));
        self.run("pg_ctl", &["-D", &data, "-w", "-t", "60", "promote"]);
        self.primary = standby;
    }

    /// Rebuilds the node that is not the primary (a crashed old primary) as
    /// a standby of the primary, from a fresh base backup, and waits until it
    /// streams (and, with [`Replication::Sync`], until it is synchronous).
    pub fn rebuild_standby(&self, node: usize) {
        assert_ne!(
            node, self.primary,
            "the primary cannot become its own standby"
        );
        let data = self.data(node);
        let _ = std::fs::remove_dir_all(&data);
        self.run(
            "pg_basebackup",
            &[
                "-h",
                "127.0.0.1",
                "-p",
                &self.ports[self.primary].to_string(),
                "-U",
                "postgres",
                "-D",
                &path_str(&data),
                "-R",
                "-X",
                "stream",
                "-c",
                "fast",
                "--no-sync",
            ],
        );
        // The copy carries the primary's `ALTER SYSTEM` settings: a standby
        // promoted later with `synchronous_standby_names` set and no standby of
        // its own would wait forever on every commit.
        let auto = data.join("postgresql.auto.conf");
        let kept: String = std::fs::read_to_string(&auto)
            .expect("read postgresql.auto.conf")
            .lines()
            .filter(|l| !l.starts_with("synchronous_standby_names"))
            .map(|l| format!("{l}\n"))
            .collect();
        std::fs::write(&auto, kept).expect("write postgresql.auto.conf");
        self.configure(node);
        self.pg_ctl_start(node);
        let mut primary =
            PgConnection::establish(&self.primary_url()).expect("connect to the primary");
        if self.replication == Replication::Sync {
            diesel::sql_query("ALTER SYSTEM SET synchronous_standby_names = '*'")
                .execute(&mut primary)
                .expect("synchronous_standby_names");
            diesel::sql_query("SELECT pg_reload_conf()::text AS state")
                .get_result::<State>(&mut primary)
                .expect("reload");
        }
        let wanted = match self.replication {
            Replication::Sync => "sync",
            Replication::Async => "async",
        };
        let deadline = std::time::Instant::now() + Duration::from_secs(30);
        loop {
            let states = diesel::sql_query(
                "SELECT sync_state AS state FROM pg_stat_replication WHERE state = 'streaming'",
            )
            .load::<State>(&mut primary)
            .expect("pg_stat_replication");
            if states.iter().any(|s| s.state == wanted) {
                break;
            }
            assert!(
                std::time::Instant::now() < deadline,
                "the standby on port {} did not become {wanted}",
                self.ports[node]
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// Index of the node that is not the primary.
    pub fn old_primary(&self) -> usize {
        self.standby()
    }

    fn data(&self, node: usize) -> PathBuf {
        self.root.join(format!("node{node}"))
    }

    /// This node's own settings, after whatever a base backup copied.
    fn configure(&self, node: usize) {
        let conf = self.data(node).join("postgresql.conf");
        let mut text = std::fs::read_to_string(&conf).expect("read postgresql.conf");
        text.push_str(&format!(
            "\n# failover test\nport = {}\nlisten_addresses = '127.0.0.1'\n\
             unix_socket_directories = '{}'\nfsync = off\nsynchronous_commit = on\n\
             max_connections = 200\nwal_keep_size = '256MB'\n",
            self.ports[node],
            path_str(&self.root)
        ));
        std::fs::write(&conf, text).expect("write postgresql.conf");
    }

    fn pg_ctl_start(&self, node: usize) {
        let data = path_str(&self.data(node));
        let log = path_str(&self.root.join(format!("node{node}.log")));
        self.run(
            "pg_ctl",
            &["-D", &data, "-l", &log, "-w", "-t", "60", "start"],
        );
    }

    fn run(&self, program: &str, args: &[&str]) {
        let exe = self.bindir.join(program);
        let mut command = match &self.run_as {
            Some(user) => {
                let mut c = Command::new("runuser");
                c.args(["-u", user, "--"]).arg(&exe);
                c
            }
            None => Command::new(&exe),
        };
        let output = command
            .args(args)
            .current_dir(&self.root)
            .stdin(Stdio::null())
            .output()
            .unwrap_or_else(|e| panic!("cannot run {}: {e}", exe.display()));
        assert!(
            output.status.success(),
            "{program} {args:?}: {}\n{}",
            output.status,
            String::from_utf8_lossy(&output.stderr)
        );
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        for node in 0..2 {
            let data = path_str(&self.data(node));
            if self.data(node).join("postmaster.pid").exists() {
                let exe = self.bindir.join("pg_ctl");
                let mut command = match &self.run_as {
                    Some(user) => {
                        let mut c = Command::new("runuser");
                        c.args(["-u", user, "--"]).arg(&exe);
                        c
                    }
                    None => Command::new(&exe),
                };
                let _ = command
                    .args(["-D", &data, "-m", "immediate", "-w", "stop"])
                    .stdout(Stdio::null())
                    .stderr(Stdio::null())
                    .status();
            }
        }
        if !std::thread::panicking() {
            let _ = std::fs::remove_dir_all(&self.root);
        }
    }
}

fn path_str(path: &Path) -> String {
    path.to_string_lossy().into_owned()
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("a free port")
        .port()
}

/// `postgres` when running as root (initdb refuses root), else nobody.
fn run_as() -> Option<String> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let uid = status.lines().find_map(|l| l.strip_prefix("Uid:"))?;
    (uid.split_whitespace().next()? == "0").then(|| "postgres".to_owned())
}
