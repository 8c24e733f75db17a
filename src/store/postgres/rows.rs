//! Postgres rows: JSON as `json`/`jsonb`, uuids as `uuid`.

use serde_json::Value;
use sqlx::Row;
use sqlx::postgres::PgRow;
use uuid::Uuid;

use crate::store::rows::DialectRow;

impl DialectRow for PgRow {
    fn json(&self, column: &str) -> Result<Option<Value>, sqlx::Error> {
        self.try_get(column)
    }

    fn raw_json(&self, column: &str) -> Result<Option<Box<serde_json::value::RawValue>>, sqlx::Error> {
        let raw: Option<sqlx::types::Json<Box<serde_json::value::RawValue>>> = self.try_get(column)?;
        Ok(raw.map(|json| json.0))
    }

    fn uuid(&self, column: &str) -> Result<Option<Uuid>, sqlx::Error> {
        self.try_get(column)
    }
}
