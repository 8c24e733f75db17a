//! What a parent gave back: each child's outcome as the results export
//! writes it, and the summary of its reasons.

use std::collections::BTreeMap;

use chrono::{DateTime, Utc};
use serde::Serialize;
use serde_json::value::RawValue;
use serde_json::{Value, json};
use utoipa::ToSchema;

use super::projection::Change;
use super::{ChildState, Counts};

/// How many reasons a summary lists.
pub const SUMMARY_REASONS: i64 = 20;

/// One child in a parent's results (`GET /v1/parents/{id}/results`): one
/// NDJSON line or CSV row, in sequence order.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct ChildResult {
    pub sequence: i64,
    pub key: Option<String>,
    /// As readers see it: a child not yet terminal is listed too, with no outcome.
    pub state: ChildState,
    /// The attempt whose outcome won; `null` without an outcome, for a
    /// child skipped at registration, or for a write from a claim older than
    /// the previous one.
    pub attempt: Option<i32>,
    /// The worker's result, as the JSON it sent.
    #[schema(value_type = Option<serde_json::Value>)]
    pub result: Option<Box<RawValue>>,
    pub reason: Option<String>,
    /// When the child became terminal; `null` while it is not.
    pub finished_at: Option<DateTime<Utc>>,
}

impl ChildResult {
    /// The CSV header, in the order `csv_row` writes the fields.
    pub const CSV_HEADER: &'static str = "sequence,key,state,attempt,result,reason,finished_at\r\n";

    /// This child as one CSV record (RFC 4180: fields with a comma, quote,
    /// CR or LF are quoted, quotes doubled; the result as its JSON text;
    /// `null` as an empty field), ended by CRLF.
    pub fn csv_row(&self, out: &mut String) {
        use std::fmt::Write;
        let _ = write!(out, "{},", self.sequence);
        csv_field(out, self.key.as_deref());
        out.push(',');
        out.push_str(self.state.as_str());
        out.push(',');
        if let Some(attempt) = self.attempt {
            let _ = write!(out, "{attempt}");
        }
        out.push(',');
        csv_field(out, self.result.as_deref().map(RawValue::get));
        out.push(',');
        csv_field(out, self.reason.as_deref());
        out.push(',');
        if let Some(at) = self.finished_at {
            out.push_str(&at.to_rfc3339_opts(chrono::SecondsFormat::AutoSi, true));
        }
        out.push_str("\r\n");
    }
}

fn csv_field(out: &mut String, value: Option<&str>) {
    let Some(value) = value else { return };
    // A leading = + - @ is left as it is: this is data, not a spreadsheet formula.
    if value.contains([',', '"', '\r', '\n']) {
        out.push('"');
        out.push_str(&value.replace('"', "\"\""));
        out.push('"');
    } else {
        out.push_str(value);
    }
}

/// How many failed or skipped children gave one reason.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, ToSchema)]
pub struct ReasonCount {
    /// `failed` or `skipped`.
    pub state: ChildState,
    /// `null`: the outcome gave no reason.
    pub reason: Option<String>,
    pub count: i64,
}

/// A parent at a glance (`GET /v1/parents/{id}/summary`).
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct Summary {
    pub parent_id: super::ParentId,
    /// Children by state: the parent's projection, as on the parent.
    pub counts: Counts,
    /// The most frequent failure and skip reasons (20 at most), most
    /// frequent first, then by state and reason.
    pub reasons: Vec<ReasonCount>,
}

/// Reconcile's change for a parent's kept reason counts (`kept`) against
/// those counted from its rows (`rows`): the (state, reason) pairs whose
/// counts differ (a pair missing on one side counts 0 there), 20 at most, in
/// state and reason order; `None` when they agree.
pub fn reasons_change(kept: &[ReasonCount], rows: &[ReasonCount]) -> Option<Change> {
    let mut both: BTreeMap<(&str, Option<&str>), (i64, i64)> = BTreeMap::new();
    for r in kept {
        both.entry((r.state.as_str(), r.reason.as_deref())).or_default().0 += r.count;
    }
    for r in rows {
        both.entry((r.state.as_str(), r.reason.as_deref())).or_default().1 += r.count;
    }
    let differ: Vec<_> = both
        .into_iter()
        .filter(|(_, (kept, rows))| kept != rows)
        .take(SUMMARY_REASONS as usize)
        .collect();
    if differ.is_empty() {
        return None;
    }
    let side = |pick: fn(&(i64, i64)) -> i64| {
        Value::Array(
            differ
                .iter()
                .map(|((state, reason), n)| json!({"state": state, "reason": reason, "count": pick(n)}))
                .collect(),
        )
    };
    Some(Change {
        field: "reasons".to_owned(),
        from: side(|n| n.0),
        to: side(|n| n.1),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn result(key: Option<&str>, result: Option<&str>, reason: Option<&str>) -> ChildResult {
        ChildResult {
            sequence: 7,
            key: key.map(str::to_owned),
            state: ChildState::Failed,
            attempt: Some(2),
            result: result.map(|r| RawValue::from_string(r.to_owned()).unwrap()),
            reason: reason.map(str::to_owned),
            finished_at: Some(DateTime::parse_from_rfc3339("2026-12-03T10:00:00.5Z").unwrap().into()),
        }
    }

    #[test]
    fn a_csv_row_quotes_what_needs_it() {
        let mut out = String::new();
        result(Some("k,1"), Some(r#"{"a":"b"}"#), Some("said \"no\"\nthen left")).csv_row(&mut out);
        assert_eq!(
            out,
            "7,\"k,1\",failed,2,\"{\"\"a\"\":\"\"b\"\"}\",\"said \"\"no\"\"\nthen left\",2026-12-03T10:00:00.500Z\r\n"
        );
    }

    #[test]
    fn a_csv_row_leaves_nulls_empty() {
        let mut out = String::new();
        let mut open = result(None, None, None);
        open.state = ChildState::Pending;
        open.attempt = None;
        open.finished_at = None;
        open.csv_row(&mut out);
        assert_eq!(out, "7,,pending,,,,\r\n");
    }

    fn count(state: ChildState, reason: Option<&str>, count: i64) -> ReasonCount {
        ReasonCount {
            state,
            reason: reason.map(str::to_owned),
            count,
        }
    }

    #[test]
    fn kept_reasons_that_agree_are_no_change() {
        let rows = [
            count(ChildState::Failed, Some("timeout"), 3),
            count(ChildState::Skipped, None, 1),
        ];
        let kept = [rows[1].clone(), rows[0].clone()];
        assert_eq!(reasons_change(&kept, &rows), None);
        assert_eq!(reasons_change(&[], &[]), None);
    }

    #[test]
    fn kept_reasons_that_differ_show_each_pair_that_differs() {
        let rows = [
            count(ChildState::Failed, Some("timeout"), 3),
            count(ChildState::Failed, Some(""), 2),
            count(ChildState::Skipped, None, 1),
        ];
        // A count off by two, an empty reason missing (not the same as no
        // reason), and a pair no row has.
        let kept = [
            count(ChildState::Failed, Some("timeout"), 5),
            count(ChildState::Failed, None, 2),
            count(ChildState::Skipped, None, 1),
        ];
        let change = reasons_change(&kept, &rows).unwrap();
        assert_eq!(change.field, "reasons");
        assert_eq!(
            change.from,
            json!([
                {"state": "failed", "reason": null, "count": 2},
                {"state": "failed", "reason": "", "count": 0},
                {"state": "failed", "reason": "timeout", "count": 5},
            ])
        );
        assert_eq!(
            change.to,
            json!([
                {"state": "failed", "reason": null, "count": 0},
                {"state": "failed", "reason": "", "count": 2},
                {"state": "failed", "reason": "timeout", "count": 3},
            ])
        );
    }

    #[test]
    fn a_change_lists_twenty_pairs_at_most() {
        let rows: Vec<_> = (0..50)
            .map(|i| count(ChildState::Failed, Some(&format!("r{i:02}")), 1))
            .collect();
        let change = reasons_change(&[], &rows).unwrap();
        assert_eq!(change.to.as_array().unwrap().len(), 20);
    }
}
