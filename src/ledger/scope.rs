//! Which queues a caller reaches: every queue, or exact names and prefixes.
//! A pure rule: `access` reads it from the tokens file, the store filters by
//! it (`store::sql::within_postgres` and `within_sqlite`, tested to agree with
//! `allows`).

use super::QueueName;

/// The queues a token reaches: every queue, or exact names and prefixes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct QueueScope {
    every: bool,
    exact: Vec<String>,
    prefixes: Vec<String>,
}

impl Default for QueueScope {
    fn default() -> Self {
        Self::every()
    }
}

impl QueueScope {
    pub fn every() -> Self {
        Self {
            every: true,
            exact: Vec::new(),
            prefixes: Vec::new(),
        }
    }

    /// Reads a file entry's `queues`: `"*"` is every queue, `"billing.*"` the
    /// queues whose names start with `billing.`, anything else one queue.
    pub fn parse(entries: &[String]) -> Result<Self, String> {
        if entries.is_empty() {
            return Err("`queues` is empty: list queue names, prefixes ending in `*`, or `*`".to_owned());
        }
        let mut scope = Self {
            every: false,
            exact: Vec::new(),
            prefixes: Vec::new(),
        };
        for entry in entries {
            if entry == "*" {
                scope.every = true;
            } else if let Some(prefix) = entry.strip_suffix('*') {
                // A prefix obeys the queue-name rules itself.
                QueueName::parse(prefix).map_err(|e| format!("queue prefix {entry:?} {}", e.0))?;
                scope.prefixes.push(prefix.to_owned());
            } else {
                QueueName::parse(entry).map_err(|e| format!("queue {entry:?} {}", e.0))?;
                scope.exact.push(entry.clone());
            }
        }
        Ok(scope)
    }

    pub fn is_every(&self) -> bool {
        self.every
    }

    /// Whether every queue `other` reaches is one this scope reaches too.
    pub fn covers(&self, other: &QueueScope) -> bool {
        if self.every {
            return true;
        }
        !other.every
            && other.exact.iter().all(|queue| self.allows(queue))
            && other
                .prefixes
                .iter()
                .all(|prefix| self.prefixes.iter().any(|mine| prefix.starts_with(mine.as_str())))
    }

    pub fn allows(&self, queue: &str) -> bool {
        self.every
            || self.exact.iter().any(|q| q == queue)
            || self.prefixes.iter().any(|p| queue.starts_with(p.as_str()))
    }

    /// The scope as the store binds it (`store::sql::within_postgres`):
    /// `{"exact": [...], "prefixes": [...]}`, or `None` for every queue.
    pub fn as_json(&self) -> Option<String> {
        (!self.every).then(|| serde_json::json!({"exact": self.exact, "prefixes": self.prefixes}).to_string())
    }

    /// The scope `as_json` wrote (kept with a background job); `None` when
    /// the text is not one.
    pub fn from_json(json: Option<&str>) -> Option<Self> {
        let Some(json) = json else {
            return Some(Self::every());
        };
        #[derive(serde::Deserialize)]
        struct Stored {
            exact: Vec<String>,
            prefixes: Vec<String>,
        }
        let stored: Stored = serde_json::from_str(json).ok()?;
        Some(Self {
            every: false,
            exact: stored.exact,
            prefixes: stored.prefixes,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::QueueScope;

    fn scope(entries: &[&str]) -> QueueScope {
        QueueScope::parse(&entries.iter().map(|e| (*e).to_owned()).collect::<Vec<_>>()).unwrap()
    }

    #[test]
    fn a_scope_covers_what_it_reaches_whole() {
        let every = scope(&["*"]);
        let a = scope(&["a"]);
        let team = scope(&["team.*"]);
        assert!(every.covers(&every) && every.covers(&a) && every.covers(&team));
        assert!(!a.covers(&every), "one queue does not cover all");
        assert!(a.covers(&a) && !a.covers(&scope(&["b"])) && !a.covers(&scope(&["a", "b"])));
        assert!(team.covers(&scope(&["team.x"])), "a prefix covers its queues");
        assert!(team.covers(&scope(&["team.x.*"])), "and narrower prefixes");
        assert!(!team.covers(&scope(&["team*"])), "not a wider one");
        assert!(!scope(&["team.x"]).covers(&team), "a queue does not cover a prefix");
    }
}
