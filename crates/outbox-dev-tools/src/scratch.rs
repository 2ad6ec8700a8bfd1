//! A throw-away database on an existing server, for `bench` and `demo`.

use anyhow::Context as _;
use diesel::prelude::*;

/// A database created on the server of `admin_url` and dropped (with its
/// connections) when this value is dropped.
#[derive(Debug)]
pub struct ScratchDatabase {
    pub name: String,
    pub url: String,
    admin_url: String,
}

impl ScratchDatabase {
    pub fn create(admin_url: &str, prefix: &str) -> anyhow::Result<ScratchDatabase> {
        let name = format!("{prefix}_{}_{}", std::process::id(), fastrand::u32(..));
        let mut admin = order_service::db::establish(admin_url)?;
        diesel::sql_query(format!("CREATE DATABASE {name}"))
            .execute(&mut admin)
            .with_context(|| format!("creating the scratch database {name}"))?;
        let mut url = url::Url::parse(admin_url).context("DATABASE_URL is not a URL")?;
        url.set_path(&format!("/{name}"));
        Ok(ScratchDatabase {
            name,
            url: url.to_string(),
            admin_url: admin_url.to_owned(),
        })
    }
}

impl Drop for ScratchDatabase {
    fn drop(&mut self) {
        let dropped = PgConnection::establish(&self.admin_url).and_then(|mut admin| {
            diesel::sql_query(format!(
                "DROP DATABASE IF EXISTS {} WITH (FORCE)",
                self.name
            ))
            .execute(&mut admin)
            .map_err(|e| diesel::ConnectionError::BadConnection(e.to_string()))
        });
        if let Err(error) = dropped {
            tracing::warn!(database = %self.name, error = %error, "could not drop the scratch database");
        }
    }
}
