//! SQLite rows: JSON and uuids are kept as text.

use serde_json::Value;
use sqlx::Row;
use sqlx::sqlite::SqliteRow;
use uuid::Uuid;

use crate::store::rows::DialectRow;

impl DialectRow for SqliteRow {
    fn json(&self, column: &str) -> Result<Option<Value>, sqlx::Error> {
        let text: Option<String> = self.try_get(column)?;
        text.map(|t| serde_json::from_str(&t).map_err(|e| sqlx::Error::Decode(e.into())))
            .transpose()
    }

    fn raw_json(&self, column: &str) -> Result<Option<Box<serde_json::value::RawValue>>, sqlx::Error> {
        let text: Option<String> = self.try_get(column)?;
        text.map(|t| serde_json::value::RawValue::from_string(t).map_err(|e| sqlx::Error::Decode(e.into())))
            .transpose()
    }

    fn uuid(&self, column: &str) -> Result<Option<Uuid>, sqlx::Error> {
        let text: Option<String> = self.try_get(column)?;
        text.map(|t| Uuid::parse_str(&t).map_err(|e| sqlx::Error::Decode(e.into())))
            .transpose()
    }
}

/// A time as a statement parameter, written as the SQLite ledger writes its
/// times (`NOW`: milliseconds, `Z`), so text comparison orders them.
pub(super) fn time_param(time: chrono::DateTime<chrono::Utc>) -> String {
    time.format("%Y-%m-%dT%H:%M:%S%.3fZ").to_string()
}
