//! A private PostgreSQL server from the machine's own installation, for the
//! zero-config demo and for tests on machines with no server running.
//!
//! It runs `initdb` into a directory of its own and starts `postgres` on a free
//! loopback port with trust authentication. `initdb` refuses to run as root, so
//! as root the server runs as the `postgres` system user.

use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

#[derive(Debug, thiserror::Error)]
pub enum PrivatePgError {
    #[error(
        "PostgreSQL's server programs (initdb, pg_ctl) were not found.\n\
         Install PostgreSQL, or set DATABASE_URL to a server you already have:\n  \
         Debian/Ubuntu: sudo apt-get install postgresql\n  \
         macOS:         brew install postgresql@16\n\
         (looked in `pg_config --bindir`, /usr/lib/postgresql/*/bin, Homebrew and PATH)"
    )]
    NotInstalled,
    #[error("{step} failed: {detail}")]
    Step { step: String, detail: String },
}

fn step(step: &str, detail: impl std::fmt::Display) -> PrivatePgError {
    PrivatePgError::Step {
        step: step.to_owned(),
        detail: detail.to_string(),
    }
}

/// A running private server; stopped and (unless persistent) deleted on drop,
/// and also when the process exits on a second Ctrl-C, which skips destructors.
#[derive(Debug)]
pub struct PrivatePostgres {
    root: PathBuf,
    bindir: PathBuf,
    port: u16,
    run_as: Option<String>,
    persistent: bool,
    forced_exit: Option<order_service::shutdown::ForcedExitCleanup>,
}

impl PrivatePostgres {
    /// A fresh server in a new temporary directory, removed on drop.
    pub fn start_temporary() -> Result<PrivatePostgres, PrivatePgError> {
        let root = std::env::temp_dir().join(format!(
            "outbox-relay-pg-{}-{}",
            std::process::id(),
            fastrand::u32(..)
        ));
        Self::start_in(root, false)
    }

    /// A server in `root`, reused if one is already running there (the test
    /// harness keeps one under `target/` across runs); left running on drop.
    pub fn start_persistent(root: &Path) -> Result<PrivatePostgres, PrivatePgError> {
        if let Some(port) = running_port(root) {
            return Ok(PrivatePostgres {
                root: root.to_owned(),
                bindir: find_bindir().ok_or(PrivatePgError::NotInstalled)?,
                port,
                run_as: run_as(),
                persistent: true,
                forced_exit: None,
            });
        }
        Self::start_in(root.to_owned(), true)
    }

    fn start_in(root: PathBuf, persistent: bool) -> Result<PrivatePostgres, PrivatePgError> {
        let bindir = find_bindir().ok_or(PrivatePgError::NotInstalled)?;
        let run_as = run_as();
        let data = root.join("data");
        if data.exists() {
            let _ = std::fs::remove_dir_all(&data);
        }
        std::fs::create_dir_all(&root).map_err(|e| step("creating the data directory", e))?;
        if let Some(user) = &run_as {
            let status = Command::new("chown")
                .arg(format!("{user}:"))
                .arg(&root)
                .status()
                .map_err(|e| step("chown", e))?;
            if !status.success() {
                return Err(step(
                    "chown",
                    format!("could not give {} to {user}", root.display()),
                ));
            }
        }
        let port = free_port().map_err(|e| step("finding a free port", e))?;
        let forced_exit = (!persistent).then(|| {
            let (root, bindir, run_as) = (root.clone(), bindir.clone(), run_as.clone());
            order_service::shutdown::on_forced_exit(move || {
                remove_server(&root, &bindir, run_as.as_deref())
            })
        });
        let server = PrivatePostgres {
            root,
            bindir,
            port,
            run_as,
            persistent,
            forced_exit,
        };
        server.run(
            "initdb",
            &[
                "-D",
                &path_str(&data),
                "-U",
                "postgres",
                "-A",
                "trust",
                "-E",
                "UTF8",
                "--locale=C",
                "--no-sync",
            ],
        )?;
        server.start()?;
        std::fs::write(server.root.join("port"), port.to_string())
            .map_err(|e| step("recording the port", e))?;
        Ok(server)
    }

    pub fn port(&self) -> u16 {
        self.port
    }

    /// Starts the server on its data directory and port (and waits until it
    /// accepts connections). Used at creation and after [`Self::stop`].
    pub fn start(&self) -> Result<(), PrivatePgError> {
        let options = format!(
            "-p {} -c listen_addresses=127.0.0.1 -k {} -c fsync=off -c synchronous_commit=off -c full_page_writes=off -c max_connections=200",
            self.port,
            path_str(&self.root)
        );
        self.run(
            "pg_ctl",
            &[
                "-D",
                &path_str(&self.root.join("data")),
                "-o",
                &options,
                "-l",
                &path_str(&self.root.join("server.log")),
                "-w",
                "-t",
                "60",
                "start",
            ],
        )
    }

    /// Stops the server, keeping its data: a "fast" shutdown, which cuts every
    /// client connection as a crash or a failover would. [`Self::start`] brings
    /// it back on the same port (fault-injection tests use the pair).
    pub fn stop(&self) -> Result<(), PrivatePgError> {
        let data = path_str(&self.root.join("data"));
        self.run(
            "pg_ctl",
            &["-D", &data, "-m", "fast", "-w", "-t", "60", "stop"],
        )
    }

    /// [`Self::stop`], then [`Self::start`].
    pub fn restart(&self) -> Result<(), PrivatePgError> {
        self.stop()?;
        self.start()
    }

    /// URL of the `postgres` database as the `postgres` superuser.
    pub fn url(&self) -> String {
        format!("postgres://postgres@127.0.0.1:{}/postgres", self.port)
    }

    fn run(&self, program: &str, args: &[&str]) -> Result<(), PrivatePgError> {
        run_tool(
            &self.root,
            &self.bindir,
            self.run_as.as_deref(),
            program,
            args,
        )
    }
}

/// Runs `program` of `bindir` in `root`, as `run_as` when given.
fn run_tool(
    root: &Path,
    bindir: &Path,
    run_as: Option<&str>,
    program: &str,
    args: &[&str],
) -> Result<(), PrivatePgError> {
    let exe = bindir.join(program);
    let mut command = match run_as {
        Some(user) => {
            let mut c = Command::new("runuser");
            c.args(["-u", user, "--"]).arg(&exe);
            c
        }
        None => Command::new(&exe),
    };
    let output = command
        .args(args)
        .current_dir(root)
        .stdin(Stdio::null())
        .output()
        .map_err(|e| step(program, format!("cannot run {}: {e}", exe.display())))?;
    if output.status.success() {
        Ok(())
    } else {
        Err(step(
            program,
            format!(
                "{}\n{}",
                output.status,
                String::from_utf8_lossy(&output.stderr).trim()
            ),
        ))
    }
}

impl Drop for PrivatePostgres {
    fn drop(&mut self) {
        if self.persistent {
            return;
        }
        remove_server(&self.root, &self.bindir, self.run_as.as_deref());
        // Only now: a second Ctrl-C during the removal above still cleans up.
        self.forced_exit.take();
    }
}

/// Stops the server in `root` at once and deletes its directory.
fn remove_server(root: &Path, bindir: &Path, run_as: Option<&str>) {
    let data = path_str(&root.join("data"));
    let _ = run_tool(
        root,
        bindir,
        run_as,
        "pg_ctl",
        &["-D", &data, "-m", "immediate", "-w", "stop"],
    );
    let _ = std::fs::remove_dir_all(root);
}

fn path_str(path: &Path) -> String {
    path.to_string_lossy().into_owned()
}

/// The port of a server already running in `root`, if it answers.
fn running_port(root: &Path) -> Option<u16> {
    let port: u16 = std::fs::read_to_string(root.join("port"))
        .ok()?
        .trim()
        .parse()
        .ok()?;
    std::net::TcpStream::connect(("127.0.0.1", port)).ok()?;
    root.join("data/postmaster.pid").exists().then_some(port)
}

fn free_port() -> std::io::Result<u16> {
    Ok(TcpListener::bind("127.0.0.1:0")?.local_addr()?.port())
}

/// `postgres` when running as root (initdb refuses root), else nobody.
fn run_as() -> Option<String> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let uid = status.lines().find_map(|l| l.strip_prefix("Uid:"))?;
    (uid.split_whitespace().next()? == "0").then(|| "postgres".to_owned())
}

/// Where `initdb` and `pg_ctl` live.
pub fn find_bindir() -> Option<PathBuf> {
    let has_tools = |dir: &Path| dir.join("initdb").is_file() && dir.join("pg_ctl").is_file();
    if let Ok(output) = Command::new("pg_config").arg("--bindir").output()
        && output.status.success()
    {
        let dir = PathBuf::from(String::from_utf8_lossy(&output.stdout).trim());
        if has_tools(&dir) {
            return Some(dir);
        }
    }
    let mut candidates: Vec<PathBuf> = Vec::new();
    for pattern_root in ["/usr/lib/postgresql", "/opt/homebrew/opt", "/usr/local/opt"] {
        if let Ok(entries) = std::fs::read_dir(pattern_root) {
            for entry in entries.flatten() {
                let name = entry.file_name().to_string_lossy().into_owned();
                if pattern_root == "/usr/lib/postgresql" || name.starts_with("postgresql") {
                    candidates.push(entry.path().join("bin"));
                }
            }
        }
    }
    // Highest major version first: the number in `15/bin` or `postgresql@16/bin`.
    let major = |dir: &PathBuf| -> u32 {
        let name = dir
            .parent()
            .and_then(Path::file_name)
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default();
        let digits: String = name
            .chars()
            .skip_while(|c| !c.is_ascii_digit())
            .take_while(char::is_ascii_digit)
            .collect();
        digits.parse().unwrap_or(0)
    };
    candidates.sort_by_key(|dir| std::cmp::Reverse(major(dir)));
    candidates.push(PathBuf::from("/usr/local/pgsql/bin"));
    if let Some(path) = std::env::var_os("PATH") {
        candidates.extend(std::env::split_paths(&path));
    }
    candidates.into_iter().find(|dir| has_tools(dir))
}
