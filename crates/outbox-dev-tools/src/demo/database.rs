//! Where the demo keeps its data: a private PostgreSQL of its own when no
//! `DATABASE_URL` is given, otherwise a scratch database on that server, so
//! the demo's orders never land in the user's own database. Either is gone
//! when the demo ends.

use anyhow::Context as _;

use crate::private_pg::PrivatePostgres;
use crate::scratch::ScratchDatabase;

#[derive(Debug)]
enum Backing {
    Private(PrivatePostgres),
    Scratch(ScratchDatabase),
}

/// The demo's migrated database, removed by [`DemoDatabase::remove`].
#[derive(Debug)]
pub struct DemoDatabase {
    pub url: String,
    backing: Backing,
}

impl DemoDatabase {
    /// Starts (or creates) the database and migrates it. Blocking: initdb and
    /// the server's start take a few seconds.
    pub fn open(database_url: Option<&str>) -> anyhow::Result<DemoDatabase> {
        let database = match database_url {
            // The private server's errors (NotInstalled above all) are the
            // whole message the user needs: no context to bury them under.
            None => {
                let server = PrivatePostgres::start_temporary()?;
                DemoDatabase {
                    url: server.url(),
                    backing: Backing::Private(server),
                }
            }
            Some(admin_url) => {
                let scratch = ScratchDatabase::create(admin_url, "outbox_demo")
                    .context("creating the demo's scratch database (DATABASE_URL)")?;
                DemoDatabase {
                    url: scratch.url.clone(),
                    backing: Backing::Scratch(scratch),
                }
            }
        };
        order_service::db::migrate_url(&database.url)?;
        Ok(database)
    }

    /// One line for people: what this database is and what happens to it.
    pub fn describe(&self) -> String {
        match &self.backing {
            Backing::Private(server) => format!(
                "a private PostgreSQL on 127.0.0.1:{} (a temporary cluster, removed on exit)",
                server.port()
            ),
            Backing::Scratch(scratch) => format!(
                "the scratch database {} on DATABASE_URL's server (dropped on exit)",
                scratch.name
            ),
        }
    }

    /// What [`DemoDatabase::remove`] removes, for the goodbye line.
    pub fn name(&self) -> String {
        match &self.backing {
            Backing::Private(server) => {
                format!("the private PostgreSQL on port {}", server.port())
            }
            Backing::Scratch(scratch) => format!("the scratch database {}", scratch.name),
        }
    }

    /// Stops the private server and deletes its files, or drops the scratch
    /// database; blocking work, done off the async threads.
    pub async fn remove(self) {
        let _ = tokio::task::spawn_blocking(move || drop(self)).await;
    }
}
