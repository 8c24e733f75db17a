//! Access control: bearer tokens with roles and queue scopes.
//!
//! The tokens file holds only SHA-256 hashes of the tokens, never the tokens:
//! `{"tokens": [{"name": "ingest", "sha256": "<hex>", "roles": ["producer"],
//! "queues": ["events", "billing.*"]}]}`. A presented token is hashed and
//! compared with every entry in constant time. The set is swapped whole on a
//! reload, so a file that does not parse leaves the old set in place.

use std::collections::HashSet;
use std::path::{Path, PathBuf};
use std::sync::{Arc, LazyLock, RwLock};

use anyhow::Context;
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

pub use crate::ledger::QueueScope;

/// What a token may do. `admin` may do everything; `producer` and `worker`
/// each add their writes to what a `reader` may do.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "lowercase")]
pub enum Role {
    Reader,
    Producer,
    Worker,
    Admin,
}

impl Role {
    pub const ALL: [Role; 4] = [Role::Reader, Role::Producer, Role::Worker, Role::Admin];

    pub fn as_str(self) -> &'static str {
        match self {
            Role::Reader => "reader",
            Role::Producer => "producer",
            Role::Worker => "worker",
            Role::Admin => "admin",
        }
    }

    /// Whether holding `self` grants what `needed` guards.
    pub fn grants(self, needed: Role) -> bool {
        self == Role::Admin || needed == Role::Reader || self == needed
    }
}

/// Who is calling, and what they may do.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Grant {
    /// The token's name from the file (`anonymous` when the service is open).
    pub name: String,
    roles: Vec<Role>,
    pub queues: QueueScope,
}

impl Grant {
    /// Everything, on every queue: the caller of a service without a tokens
    /// file. One shared grant, not one per request.
    pub fn anonymous() -> Arc<Self> {
        static ANONYMOUS: LazyLock<Arc<Grant>> = LazyLock::new(|| {
            Arc::new(Grant {
                name: "anonymous".to_owned(),
                roles: vec![Role::Admin],
                queues: QueueScope::every(),
            })
        });
        Arc::clone(&ANONYMOUS)
    }

    pub fn may(&self, needed: Role) -> bool {
        self.roles.iter().any(|role| role.grants(needed))
    }

    pub fn reaches(&self, queue: &str) -> bool {
        self.queues.allows(queue)
    }
}

/// One entry of the tokens file.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TokenEntry {
    pub name: String,
    /// Hex SHA-256 of the token.
    pub sha256: String,
    pub roles: Vec<Role>,
    #[serde(default = "every_queue")]
    pub queues: Vec<String>,
}

fn every_queue() -> Vec<String> {
    vec!["*".to_owned()]
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct TokensFile {
    tokens: Vec<TokenEntry>,
}

/// The tokens of one reading of the file.
#[derive(Debug, Default)]
pub struct TokenSet {
    entries: Vec<([u8; 32], Arc<Grant>)>,
}

impl TokenSet {
    /// Reads a tokens file's text, checking every entry: a name, a 64-digit
    /// hex hash, at least one role, valid queues, no name or hash twice.
    pub fn parse(text: &str) -> anyhow::Result<Self> {
        let file: TokensFile = serde_json::from_str(text).context("not a tokens file")?;
        let mut names = HashSet::new();
        let mut hashes = HashSet::new();
        let mut entries = Vec::with_capacity(file.tokens.len());
        for (i, entry) in file.tokens.into_iter().enumerate() {
            let at = format!("tokens[{i}]");
            anyhow::ensure!(!entry.name.trim().is_empty(), "{at}.name is empty");
            anyhow::ensure!(
                names.insert(entry.name.clone()),
                "{at}.name {:?} is used twice",
                entry.name
            );
            let hash = parse_hash(&entry.sha256).with_context(|| format!("{at}.sha256"))?;
            anyhow::ensure!(hashes.insert(hash), "{at}.sha256 is the hash of an earlier entry");
            anyhow::ensure!(!entry.roles.is_empty(), "{at}.roles is empty");
            let queues = QueueScope::parse(&entry.queues).map_err(|e| anyhow::anyhow!("{at}.queues: {e}"))?;
            entries.push((
                hash,
                Arc::new(Grant {
                    name: entry.name,
                    roles: entry.roles,
                    queues,
                }),
            ));
        }
        Ok(Self { entries })
    }

    pub fn load(path: &Path) -> anyhow::Result<Self> {
        let text = std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
        Self::parse(&text).with_context(|| format!("in {}", path.display()))
    }

    pub fn len(&self) -> usize {
        self.entries.len()
    }

    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// The grant of the entry whose hash is the token's. Every entry is
    /// compared, in constant time each, whichever matches.
    pub fn find(&self, token: &str) -> Option<Arc<Grant>> {
        let presented: [u8; 32] = Sha256::digest(token.as_bytes()).into();
        let mut found = None;
        for (hash, grant) in &self.entries {
            if same_bytes(hash, &presented) {
                found = Some(grant);
            }
        }
        found.cloned()
    }
}

fn parse_hash(hex_text: &str) -> anyhow::Result<[u8; 32]> {
    let bytes = hex::decode(hex_text.trim()).context("not hex")?;
    bytes
        .try_into()
        .map_err(|b: Vec<u8>| anyhow::anyhow!("is {} bytes; a SHA-256 is 32 (64 hex digits)", b.len()))
}

/// Compares without stopping at the first difference.
fn same_bytes(a: &[u8; 32], b: &[u8; 32]) -> bool {
    let difference = a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y));
    std::hint::black_box(difference) == 0
}

/// Why a request was not authenticated: the `reason` label of
/// `child_ledger_auth_failures_total`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AuthFailure {
    /// No `Authorization` header.
    Missing,
    /// An `Authorization` header that is not `Bearer <token>`.
    Malformed,
    /// More than one `Authorization` header: which one counts would be a
    /// guess (a proxy and the service could each take a different one).
    Repeated,
    /// A bearer token that is in no entry.
    Unknown,
}

impl AuthFailure {
    /// What the caller should do, for the problem's `detail`.
    pub fn explain(self) -> &'static str {
        match self {
            AuthFailure::Missing => "this operation needs a token: send `Authorization: Bearer <token>`",
            AuthFailure::Malformed => "the Authorization header is not `Bearer <token>`",
            AuthFailure::Repeated => "send one Authorization header: this request has several",
            AuthFailure::Unknown => "the bearer token is not known to this service",
        }
    }

    /// The `WWW-Authenticate` challenge (RFC 6750).
    pub fn challenge(self) -> &'static str {
        match self {
            AuthFailure::Missing => "Bearer realm=\"child-ledger\"",
            AuthFailure::Malformed | AuthFailure::Repeated => {
                "Bearer realm=\"child-ledger\", error=\"invalid_request\""
            }
            AuthFailure::Unknown => "Bearer realm=\"child-ledger\", error=\"invalid_token\"",
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            AuthFailure::Missing => "missing",
            AuthFailure::Malformed => "malformed",
            AuthFailure::Repeated => "repeated",
            AuthFailure::Unknown => "unknown",
        }
    }
}

/// The service's access rules: open (no tokens), or the tokens of the file
/// as last read successfully.
#[derive(Debug, Default)]
pub struct Access {
    /// `None`: the service is open.
    tokens: Option<RwLock<Arc<TokenSet>>>,
    /// Where `reload` reads them from.
    file: Option<PathBuf>,
    /// Moves on at every reload that took: what an open stream checks its
    /// token against again, so a revoked or narrowed token's streams end.
    reloads: tokio::sync::watch::Sender<u64>,
}

impl Access {
    /// No tokens: every caller may do everything.
    pub fn open() -> Self {
        Self::default()
    }

    /// Whether the service has no tokens (every caller is the same admin).
    pub fn is_open(&self) -> bool {
        self.tokens.is_none()
    }

    pub fn from_file(path: &Path) -> anyhow::Result<Self> {
        Ok(Self {
            file: Some(path.to_owned()),
            ..Self::from_tokens(TokenSet::load(path)?)
        })
    }

    /// A fixed set of tokens, as tests and embedders build it.
    pub fn from_tokens(tokens: TokenSet) -> Self {
        Self {
            tokens: Some(RwLock::new(Arc::new(tokens))),
            ..Self::default()
        }
    }

    /// Re-reads the tokens file. On any error the old set stays.
    pub fn reload(&self) -> anyhow::Result<usize> {
        let (Some(path), Some(current)) = (&self.file, &self.tokens) else {
            anyhow::bail!("no tokens file to reload");
        };
        let tokens = TokenSet::load(path)?;
        let count = tokens.len();
        *current.write().unwrap_or_else(|e| e.into_inner()) = Arc::new(tokens);
        self.reloads.send_modify(|n| *n += 1);
        Ok(count)
    }

    /// Changes at every reload that took (see `reload`).
    pub fn reloads(&self) -> tokio::sync::watch::Receiver<u64> {
        self.reloads.subscribe()
    }

    /// Who a request's `Authorization` header names, given the value of
    /// each it has: exactly one is taken.
    pub fn authenticate(&self, authorization: &[&[u8]]) -> Result<Arc<Grant>, AuthFailure> {
        let Some(current) = &self.tokens else {
            return Ok(Grant::anonymous());
        };
        let header = match authorization {
            [] => return Err(AuthFailure::Missing),
            [header] => *header,
            _ => return Err(AuthFailure::Repeated),
        };
        let token = bearer_token(header).ok_or(AuthFailure::Malformed)?;
        let tokens = Arc::clone(&current.read().unwrap_or_else(|e| e.into_inner()));
        tokens.find(token).ok_or(AuthFailure::Unknown)
    }
}

/// The token of `Bearer <token>` (the scheme in any case, RFC 7235).
fn bearer_token(header: &[u8]) -> Option<&str> {
    let header = std::str::from_utf8(header).ok()?;
    let (scheme, token) = header.split_once(' ')?;
    let token = token.trim();
    (scheme.eq_ignore_ascii_case("bearer") && !token.is_empty() && !token.contains(' ')).then_some(token)
}

/// A fresh token (256 random bits) and its file entry.
pub fn new_token(name: &str, roles: Vec<Role>, queues: Vec<String>) -> anyhow::Result<(String, TokenEntry)> {
    anyhow::ensure!(!name.trim().is_empty(), "--name is empty");
    anyhow::ensure!(!roles.is_empty(), "give at least one --role");
    let queues = if queues.is_empty() { every_queue() } else { queues };
    QueueScope::parse(&queues).map_err(|e| anyhow::anyhow!("--queue: {e}"))?;
    let mut secret = [0u8; 32];
    getrandom::fill(&mut secret).map_err(|e| anyhow::anyhow!("no randomness from the system: {e}"))?;
    let token = format!("clt_{}", hex::encode(secret));
    let entry = TokenEntry {
        name: name.to_owned(),
        sha256: hex::encode(Sha256::digest(token.as_bytes())),
        roles,
        queues,
    };
    Ok((token, entry))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn set(entries: serde_json::Value) -> anyhow::Result<TokenSet> {
        TokenSet::parse(&serde_json::json!({ "tokens": entries }).to_string())
    }

    #[test]
    fn roles_grant_their_own_writes_and_reads() {
        for role in Role::ALL {
            assert!(role.grants(Role::Reader));
            assert!(Role::Admin.grants(role));
        }
        assert!(!Role::Producer.grants(Role::Worker));
        assert!(!Role::Worker.grants(Role::Producer));
        assert!(!Role::Worker.grants(Role::Admin));
        assert!(!Role::Reader.grants(Role::Producer));
    }

    #[test]
    fn scopes_match_names_and_prefixes() {
        let scope = QueueScope::parse(&["events".into(), "billing.*".into()]).unwrap();
        assert!(scope.allows("events"));
        assert!(scope.allows("billing.eu"));
        assert!(!scope.allows("events2"));
        assert!(!scope.allows("billing"));
        assert!(QueueScope::parse(&["*".into()]).unwrap().allows("anything"));
        assert!(QueueScope::parse(&[]).is_err());
        assert!(QueueScope::parse(&["Bad".into()]).is_err());
        assert!(QueueScope::parse(&["a*b*".into()]).is_err());
    }

    #[test]
    fn a_token_is_found_by_its_hash_only() {
        let (token, entry) = new_token("ingest", vec![Role::Producer], vec!["events".into()]).unwrap();
        assert!(token.len() >= 4 + 64, "256 bits of hex");
        let tokens = set(serde_json::json!([entry])).unwrap();
        let grant = tokens.find(&token).unwrap();
        assert_eq!(grant.name, "ingest");
        assert!(grant.may(Role::Producer) && !grant.may(Role::Worker));
        assert!(grant.reaches("events") && !grant.reaches("other"));
        assert!(tokens.find(&token[..token.len() - 1]).is_none());
        assert!(tokens.find(&entry.sha256).is_none(), "the hash is not the token");
    }

    #[test]
    fn a_broken_file_is_refused_whole() {
        let good = serde_json::json!({"name": "a", "sha256": "00".repeat(32), "roles": ["reader"]});
        assert_eq!(set(serde_json::json!([good.clone()])).unwrap().len(), 1);
        for bad in [
            serde_json::json!([good.clone(), good.clone()]),
            serde_json::json!([{"name": "a", "sha256": "zz", "roles": ["reader"]}]),
            serde_json::json!([{"name": "a", "sha256": "00".repeat(31), "roles": ["reader"]}]),
            serde_json::json!([{"name": "a", "sha256": "00".repeat(32), "roles": []}]),
            serde_json::json!([{"name": "a", "sha256": "00".repeat(32), "roles": ["root"]}]),
            serde_json::json!([{"name": "a", "sha256": "00".repeat(32), "roles": ["reader"], "queues": []}]),
            serde_json::json!([{"name": "a", "sha256": "00".repeat(32), "roles": ["reader"], "extra": 1}]),
        ] {
            assert!(set(bad.clone()).is_err(), "{bad}");
        }
        assert!(TokenSet::parse("{").is_err());
    }

    #[test]
    fn only_bearer_headers_carry_a_token() {
        assert_eq!(bearer_token(b"Bearer abc"), Some("abc"));
        assert_eq!(bearer_token(b"bearer abc"), Some("abc"));
        assert_eq!(bearer_token(b"Basic abc"), None);
        assert_eq!(bearer_token(b"Bearer "), None);
        assert_eq!(bearer_token(b"Bearer a b"), None);
        assert_eq!(bearer_token(b"Bearer"), None);
    }

    #[test]
    fn an_open_service_lets_anyone_do_anything() {
        let access = Access::open();
        let grant = access.authenticate(&[]).unwrap();
        assert!(grant.may(Role::Admin) && grant.queues.is_every());
        let closed = Access::from_tokens(TokenSet::default());
        assert_eq!(closed.authenticate(&[]), Err(AuthFailure::Missing));
        assert_eq!(closed.authenticate(&[b"Token x"]), Err(AuthFailure::Malformed));
        assert_eq!(closed.authenticate(&[b"Bearer x"]), Err(AuthFailure::Unknown));
        assert_eq!(
            closed.authenticate(&[b"Bearer x", b"Bearer y"]),
            Err(AuthFailure::Repeated)
        );
    }
}
