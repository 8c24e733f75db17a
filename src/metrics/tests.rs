//! The metrics as a scrape shows them.

use super::*;

#[test]
fn histogram_buckets_are_cumulative_and_end_in_inf() {
    let metrics = Metrics::default();
    for ms in [0.5, 3.0, 3.0, 200.0, 40_000.0] {
        metrics.request(
            "GET",
            "/v1/parents/{parent_id}",
            200,
            Duration::from_secs_f64(ms / 1000.0),
        );
    }
    let text = metrics.render(&[], 0, 0, WaitingClaims::default(), &[]);
    let bucket = |le: &str| {
        let prefix = format!(
            "child_ledger_http_request_duration_seconds_bucket{{method=\"GET\",route=\"/v1/parents/{{parent_id}}\",le=\"{le}\"}} "
        );
        text.lines()
            .find_map(|l| l.strip_prefix(&prefix))
            .unwrap_or_else(|| panic!("no bucket {le} in\n{text}"))
            .parse::<u64>()
            .unwrap()
    };
    assert_eq!(bucket("0.001"), 1);
    assert_eq!(bucket("0.005"), 3);
    assert_eq!(bucket("0.25"), 4);
    assert_eq!(bucket("30"), 4);
    assert_eq!(bucket("+Inf"), 5);
    assert!(text.contains(
        "child_ledger_http_request_duration_seconds_count{method=\"GET\",route=\"/v1/parents/{parent_id}\"} 5"
    ));
    assert!(text.contains(
        "child_ledger_http_requests_total{method=\"GET\",route=\"/v1/parents/{parent_id}\",status=\"200\"} 5"
    ));
}

#[test]
fn counters_and_gauges_render_with_their_labels() {
    let metrics = Metrics::default();
    metrics.claimed("events", 3);
    metrics.claimed("events", 0);
    metrics.outcome("processed", "applied");
    metrics.outcome("processed", "applied");
    metrics.outcome("failed", "conflict");
    metrics.request("FOO1", "unmatched", 405, Duration::ZERO);
    metrics.request("FOO2", "unmatched", 405, Duration::ZERO);
    let pools = [PoolStats {
        name: "postgres",
        size: 5,
        idle: 2,
        max: 16,
    }];
    let text = metrics.render(
        &pools,
        4,
        2,
        WaitingClaims {
            waiting: 3,
            woken_total: 7,
        },
        &[],
    );
    for line in [
        "child_ledger_children_claimed_total{queue=\"events\"} 3",
        "child_ledger_outcomes_total{outcome=\"processed\",status=\"applied\"} 2",
        "child_ledger_outcomes_total{outcome=\"failed\",status=\"conflict\"} 1",
        "child_ledger_leases_expired_total 4",
        "child_ledger_parents_completed_total 2",
        "child_ledger_http_requests_total{method=\"OTHER\",route=\"unmatched\",status=\"405\"} 2",
        "child_ledger_db_pool_connections{pool=\"postgres\",state=\"idle\"} 2",
        "child_ledger_db_pool_connections{pool=\"postgres\",state=\"in_use\"} 3",
        "child_ledger_db_pool_max_connections{pool=\"postgres\"} 16",
        "child_ledger_waiting_claims 3",
        "child_ledger_claim_wakeups_total 7",
        "# TYPE child_ledger_http_request_duration_seconds histogram",
    ] {
        assert!(text.lines().any(|l| l == line), "missing {line:?} in\n{text}");
    }
}

/// Dashboards and alerts name these families: names, types and help
/// (one full stop, added by the registry) stay as they were.
#[test]
fn families_keep_their_names_types_and_help() {
    let metrics = Metrics::default();
    metrics.request("GET", "/healthz", 200, Duration::ZERO);
    metrics.claimed("events", 1);
    metrics.outcome("processed", "applied");
    metrics.auth_failure("missing");
    metrics.webhook_delivery("delivered");
    let pools = [PoolStats {
        name: "sqlite_writer",
        size: 1,
        idle: 1,
        max: 1,
    }];
    let queues = [QueueGauge {
        queue: "events".to_owned(),
        oldest_pending_age_seconds: Some(1.0),
        ..QueueGauge::default()
    }];
    let text = metrics.render(&pools, 0, 0, WaitingClaims::default(), &queues);
    let types: Vec<&str> = text.lines().filter(|l| l.starts_with("# TYPE ")).collect();
    assert_eq!(
        types,
        [
            "# TYPE child_ledger_http_requests_total counter",
            "# TYPE child_ledger_http_request_duration_seconds histogram",
            "# TYPE child_ledger_children_claimed_total counter",
            "# TYPE child_ledger_outcomes_total counter",
            "# TYPE child_ledger_auth_failures_total counter",
            "# TYPE child_ledger_pruned_total counter",
            "# TYPE child_ledger_webhook_deliveries_total counter",
            "# TYPE child_ledger_webhook_outbox_backlog gauge",
            "# TYPE child_ledger_event_streams gauge",
            "# TYPE child_ledger_event_stream_reads_total counter",
            "# TYPE child_ledger_leases_expired_total counter",
            "# TYPE child_ledger_parents_completed_total counter",
            "# TYPE child_ledger_waiting_claims gauge",
            "# TYPE child_ledger_claim_wakeups_total counter",
            "# TYPE child_ledger_db_pool_connections gauge",
            "# TYPE child_ledger_db_pool_max_connections gauge",
            "# TYPE child_ledger_queue_children gauge",
            "# TYPE child_ledger_queue_oldest_pending_age_seconds gauge",
        ]
    );
    assert!(
        text.lines().any(|l| l
            == "# HELP child_ledger_http_requests_total HTTP requests answered, by method, route template and status."),
        "{text}"
    );
    for help in text.lines().filter(|l| l.starts_with("# HELP ")) {
        assert!(help.ends_with('.') && !help.ends_with(".."), "{help}");
    }
    assert!(
        !text.contains("# EOF"),
        "OpenMetrics, not the 0.0.4 text format:\n{text}"
    );
}

#[test]
fn claimed_queues_past_the_limit_count_as_other() {
    let metrics = Metrics::with_max_queues(2);
    for queue in ["a", "b", "c", "d", "a"] {
        metrics.claimed(queue, 1);
    }
    let text = metrics.render(&[], 0, 0, WaitingClaims::default(), &[]);
    let mut claimed: Vec<&str> = text
        .lines()
        .filter(|l| l.starts_with("child_ledger_children_claimed_total{"))
        .collect();
    claimed.sort_unstable();
    assert_eq!(
        claimed,
        [
            "child_ledger_children_claimed_total{queue=\"a\"} 2",
            "child_ledger_children_claimed_total{queue=\"b\"} 1",
            "child_ledger_children_claimed_total{queue=\"other\"} 2",
        ]
    );
}

#[test]
fn queue_gauges_render_by_queue_and_state() {
    let queues = [
        QueueGauge {
            queue: "events".to_owned(),
            pending: 4,
            in_flight: 2,
            held: 1,
            oldest_pending_age_seconds: Some(12.5),
            flow_keys: vec![("tenant-1".to_owned(), 2)],
        },
        QueueGauge {
            queue: "billing".to_owned(),
            pending: 0,
            in_flight: 3,
            held: 0,
            oldest_pending_age_seconds: None,
            flow_keys: Vec::new(),
        },
    ];
    let text = Metrics::default().render(&[], 0, 0, WaitingClaims::default(), &queues);
    let mut lines: Vec<&str> = text.lines().filter(|l| l.starts_with("child_ledger_queue_")).collect();
    lines.sort_unstable();
    assert_eq!(
        lines,
        [
            "child_ledger_queue_children{queue=\"billing\",state=\"held\"} 0",
            "child_ledger_queue_children{queue=\"billing\",state=\"in_flight\"} 3",
            "child_ledger_queue_children{queue=\"billing\",state=\"pending\"} 0",
            "child_ledger_queue_children{queue=\"events\",state=\"held\"} 1",
            "child_ledger_queue_children{queue=\"events\",state=\"in_flight\"} 2",
            "child_ledger_queue_children{queue=\"events\",state=\"pending\"} 4",
            // No pending child in billing: no age, rather than a made-up 0.
            "child_ledger_queue_oldest_pending_age_seconds{queue=\"events\"} 12.5",
        ],
        "{text}"
    );
    assert!(
        text.contains("child_ledger_flow_key_in_flight{queue=\"events\",flow_key=\"tenant-1\"} 2"),
        "{text}"
    );
}

#[test]
fn queue_gauges_show_the_first_queues_by_name() {
    let queue = |name: &str| QueueGauge {
        queue: name.to_owned(),
        pending: 1,
        ..QueueGauge::default()
    };
    let queues = [queue("c"), queue("a"), queue("b")];
    let text = Metrics::with_max_queues(2).render(&[], 0, 0, WaitingClaims::default(), &queues);
    let mut shown: Vec<&str> = text
        .lines()
        .filter_map(|l| l.strip_prefix("child_ledger_queue_children{queue=\""))
        .filter_map(|l| l.split('"').next())
        .collect();
    shown.sort_unstable();
    shown.dedup();
    assert_eq!(shown, ["a", "b"]);
}

/// A fresh service's first scrape already has every counter series an alert
/// or a `rate()` panel names, at 0: "no data" would hide a stalled queue.
#[test]
fn known_series_exist_at_zero_from_the_first_scrape() {
    let metrics = Metrics::default();
    let queues = [QueueGauge {
        queue: "events".to_owned(),
        ..QueueGauge::default()
    }];
    let text = metrics.render(&[], 0, 0, WaitingClaims::default(), &queues);
    for outcome in ["processed", "failed", "skipped"] {
        for status in [
            "applied",
            "duplicate",
            "conflict",
            "claim_mismatch",
            "not_found",
            "not_decomposed",
        ] {
            let line = format!("child_ledger_outcomes_total{{outcome=\"{outcome}\",status=\"{status}\"}} 0");
            assert!(text.lines().any(|l| l == line), "missing {line:?} in\n{text}");
        }
    }
    for line in [
        "child_ledger_children_claimed_total{queue=\"other\"} 0",
        "child_ledger_children_claimed_total{queue=\"events\"} 0",
        "child_ledger_auth_failures_total{reason=\"missing\"} 0",
        "child_ledger_webhook_deliveries_total{status=\"failed\"} 0",
    ] {
        assert!(text.lines().any(|l| l == line), "missing {line:?} in\n{text}");
    }
    // Counting then starts from those zeros.
    metrics.claimed("events", 2);
    let text = metrics.render(&[], 0, 0, WaitingClaims::default(), &queues);
    assert!(
        text.lines()
            .any(|l| l == "child_ledger_children_claimed_total{queue=\"events\"} 2"),
        "{text}"
    );
}
