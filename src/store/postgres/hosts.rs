//! Several hosts in one Postgres URL, as libpq writes them:
//! `postgres://user@db-a:5432,db-b:5432/ledger?target_session_attrs=read-write`.
//! sqlx connects to one host, so the service tries each in order and uses
//! the first that fits: a writable one (`read-write`, or `primary`; the
//! default when several hosts are given), or the first that answers
//! (`any`). A URL with one host is used as it is, once it is writable
//! (unless `target_session_attrs=any`): a standby cannot hold the ledger.

use std::time::Duration;

use anyhow::Context;
use sqlx::Connection;
use sqlx::postgres::{PgConnectOptions, PgConnection};

use crate::store::permanent_connect_error;

/// How long one host may take to answer before the next is tried.
const HOST_TIMEOUT: Duration = Duration::from_secs(5);

/// Whether the host answering accepts writes: not a standby, not a primary
/// set read-only. Simple protocol, so a transaction pooler may answer it.
pub(super) const WRITABLE: &str = "SELECT NOT pg_is_in_recovery() AND current_setting('transaction_read_only') = 'off'";

/// A URL no retry can make usable (`permanent_connect_error` says so).
fn config_error(why: String) -> anyhow::Error {
    anyhow::Error::new(sqlx::Error::Configuration(why.into()))
}

/// A Postgres URL's hosts, each as a URL of its own.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Hosts {
    /// One URL per host, in the order given, without `target_session_attrs`
    /// when there are several.
    pub urls: Vec<String>,
    /// Only a writable host will do (unless `target_session_attrs=any`).
    pub read_write: bool,
}

impl Hosts {
    /// Splits `url`'s host list (`host[:port],host[:port]`, IPv6 in brackets).
    /// A URL with one host is kept whole, checked by nothing more than sqlx.
    pub fn parse(url: &str) -> anyhow::Result<Self> {
        let (scheme, rest) = url
            .split_once("://")
            .ok_or_else(|| config_error("a Postgres URL starts with postgres://".to_owned()))?;
        let authority_end = rest.find(['/', '?']).unwrap_or(rest.len());
        let (authority, tail) = rest.split_at(authority_end);
        let (userinfo, hosts) = match authority.rfind('@') {
            Some(at) => authority.split_at(at + 1),
            None => ("", authority),
        };
        let (path, query) = tail.split_once('?').unwrap_or((tail, ""));
        let mut attrs = None;
        let kept: Vec<&str> = query
            .split('&')
            .filter(|pair| !pair.is_empty())
            .filter(|pair| match pair.split_once('=') {
                Some(("target_session_attrs", value)) => {
                    attrs = Some(value.to_owned());
                    false
                }
                _ => true,
            })
            .collect();
        let read_write = match attrs.as_deref() {
            None | Some("read-write" | "primary") => true,
            Some("any") => false,
            Some(other) => {
                return Err(config_error(format!(
                    "target_session_attrs={other} is not supported: use read-write (or primary: the writable host) or any"
                )));
            }
        };
        let query = if kept.is_empty() {
            String::new()
        } else {
            format!("?{}", kept.join("&"))
        };
        if !hosts.contains(',') {
            // One host (or none: a socket named in the query): as it is.
            let url = match attrs {
                Some(_) => format!("{scheme}://{userinfo}{hosts}{path}{query}"),
                None => url.to_owned(),
            };
            return Ok(Self {
                urls: vec![url],
                read_write,
            });
        }
        let hosts: Vec<&str> = hosts.split(',').collect();
        if hosts.iter().any(|h| h.is_empty()) {
            return Err(config_error("an empty host in the host list".to_owned()));
        }
        let urls = hosts
            .iter()
            .map(|host| format!("{scheme}://{userinfo}{host}{path}{query}"))
            .collect();
        Ok(Self { urls, read_write })
    }

    /// The URL of the host to use: the first in order that answers and, when
    /// `read_write`, accepts writes. When none does, the error says why for
    /// each (retried by the caller unless it is one no retry can fix, such as
    /// a refused password). One host that is not checked is used untried.
    pub async fn pick(&self) -> anyhow::Result<String> {
        if let [only] = self.urls.as_slice()
            && !self.read_write
        {
            return Ok(only.clone());
        }
        let mut why = Vec::new();
        for url in &self.urls {
            match Self::fits(url, self.read_write).await {
                Ok(true) => return Ok(url.clone()),
                Ok(false) => why.push(format!("{}: read-only (a standby)", Self::host_of(url))),
                Err(err) => {
                    if permanent_connect_error(&err).is_some() {
                        return Err(err.context(format!("connecting to {}", Self::host_of(url))));
                    }
                    why.push(format!("{}: {err:#}", Self::host_of(url)));
                }
            }
        }
        anyhow::bail!(
            "no {}host among the database URL's {}: {}",
            if self.read_write { "writable " } else { "" },
            self.urls.len(),
            why.join("; ")
        )
    }

    /// Whether the host of `url` answers, and accepts writes when `read_write`.
    async fn fits(url: &str, read_write: bool) -> anyhow::Result<bool> {
        // No startup parameter a transaction pooler in front may refuse.
        let options = url.parse::<PgConnectOptions>()?.extra_float_digits(None);
        let mut conn = tokio::time::timeout(HOST_TIMEOUT, PgConnection::connect_with(&options))
            .await
            .context("no answer in 5 s")??;
        let writable = if read_write {
            let row = sqlx::raw_sql(WRITABLE).fetch_one(&mut conn).await?;
            sqlx::Row::try_get::<bool, _>(&row, 0)?
        } else {
            true
        };
        conn.close().await?;
        Ok(writable)
    }

    /// `host:port` of a one-host URL, for messages (never its password).
    pub fn host_of(url: &str) -> &str {
        let rest = url.split_once("://").map_or(url, |(_, rest)| rest);
        let authority = &rest[..rest.find(['/', '?']).unwrap_or(rest.len())];
        authority.rsplit_once('@').map_or(authority, |(_, host)| host)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_host_is_used_as_it_is() {
        let url = "postgres://u:p@db:5432/ledger?sslmode=require";
        let hosts = Hosts::parse(url).unwrap();
        assert_eq!(hosts.urls, vec![url.to_owned()]);
        assert!(hosts.read_write, "a standby cannot hold the ledger");
        let any = Hosts::parse("postgres://db/l?target_session_attrs=any&sslmode=prefer").unwrap();
        assert_eq!(any.urls, vec!["postgres://db/l?sslmode=prefer".to_owned()]);
        assert!(!any.read_write);
    }

    #[test]
    fn several_hosts_want_a_writable_one_by_default() {
        let hosts = Hosts::parse("postgres://u:p@db-a:5432,db-b:5433,[::1]:5434/ledger?sslmode=prefer").unwrap();
        assert_eq!(
            hosts.urls,
            vec![
                "postgres://u:p@db-a:5432/ledger?sslmode=prefer",
                "postgres://u:p@db-b:5433/ledger?sslmode=prefer",
                "postgres://u:p@[::1]:5434/ledger?sslmode=prefer",
            ]
        );
        assert!(hosts.read_write);
    }

    #[test]
    fn target_session_attrs_is_read_and_taken_out() {
        let hosts = Hosts::parse("postgres://a,b/ledger?target_session_attrs=any&application_name=x").unwrap();
        assert_eq!(
            hosts.urls,
            vec![
                "postgres://a/ledger?application_name=x",
                "postgres://b/ledger?application_name=x"
            ]
        );
        assert!(!hosts.read_write);
        let hosts = Hosts::parse("postgres://a,b?target_session_attrs=primary").unwrap();
        assert_eq!(hosts.urls, vec!["postgres://a", "postgres://b"]);
        assert!(hosts.read_write);
        let err = Hosts::parse("postgres://a,b/l?target_session_attrs=standby").unwrap_err();
        assert!(err.to_string().contains("target_session_attrs=standby"), "{err}");
        assert!(Hosts::parse("postgres://a,,b/l").is_err());
    }

    #[test]
    fn a_host_is_named_without_its_password() {
        assert_eq!(Hosts::host_of("postgres://u:secret@db-a:5432/ledger?x=1"), "db-a:5432");
        assert_eq!(Hosts::host_of("postgres://db-b/ledger"), "db-b");
    }
}
