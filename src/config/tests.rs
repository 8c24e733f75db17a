use super::*;

#[test]
fn defaults_match_the_contract() {
    let Command::Serve(config) = Cli::try_parse_args(["child-ledger"]).unwrap().command else {
        panic!("no command is serve");
    };
    assert_eq!(config.listen.to_string(), "127.0.0.1:8080");
    let parsed = config.limits;
    let default = Limits::default();
    assert_eq!(parsed.max_body_bytes, default.max_body_bytes);
    assert_eq!(parsed.max_children_per_request, default.max_children_per_request);
    assert_eq!(parsed.max_claim_limit, default.max_claim_limit);
    assert_eq!(parsed.default_lease_seconds, default.default_lease_seconds);
    assert_eq!(parsed.max_lease_seconds, default.max_lease_seconds);
    assert_eq!(parsed.max_outcomes_per_request, default.max_outcomes_per_request);
    assert_eq!(parsed.max_payload_bytes, default.max_payload_bytes);
    assert_eq!(parsed.max_result_bytes, default.max_result_bytes);
    assert_eq!(parsed.max_metric_queues, default.max_metric_queues);
    assert_eq!(parsed.max_waiting_claims, default.max_waiting_claims);
    assert_eq!(parsed.max_bulk_bodies, default.max_bulk_bodies);
    assert_eq!(parsed.max_wait_seconds, default.max_wait_seconds);
    assert_eq!(parsed.wait_recheck_ms, default.wait_recheck_ms);
    assert_eq!(parsed.max_response_bytes, default.max_response_bytes);
    default.check().unwrap();
    let tight = Limits {
        max_response_bytes: default.max_payload_bytes,
        ..default
    };
    assert!(tight.check().unwrap_err().to_string().contains("--max-response-bytes"));
}

#[test]
fn token_new_takes_roles_and_queues() {
    let cli = Cli::try_parse_args([
        "child-ledger",
        "token",
        "new",
        "--name",
        "ingest",
        "--role",
        "producer",
        "--queue",
        "events",
        "--queue",
        "billing.*",
    ])
    .unwrap();
    let Command::Token {
        command: TokenCommand::New { name, roles, queues },
    } = cli.command
    else {
        panic!("not token new");
    };
    assert_eq!(name, "ingest");
    assert_eq!(roles, [Role::Producer]);
    assert_eq!(queues, ["events", "billing.*"]);
    assert!(
        Cli::try_parse_args(["child-ledger", "token", "new", "--name", "x"]).is_err(),
        "a role is required"
    );
    let Command::Serve(config) = Cli::try_parse_args(["child-ledger"]).unwrap().command else {
        panic!("no command is serve");
    };
    assert!(!config.allow_anonymous);
}

#[test]
fn webhook_secret_takes_a_queue() {
    let cli = Cli::try_parse_args(["child-ledger", "webhook", "secret", "--queue", "events"]).unwrap();
    let Command::Webhook {
        command: WebhookCommand::Secret { queue, .. },
    } = cli.command
    else {
        panic!("not webhook secret");
    };
    assert_eq!(queue.as_str(), "events");
    assert!(Cli::try_parse_args(["child-ledger", "webhook", "secret", "--queue", "Bad"]).is_err());
    assert!(Cli::try_parse_args(["child-ledger", "webhook", "secret"]).is_err());
    assert!(Cli::try_parse_args(["child-ledger", "--webhook-allow-hosts", "0x7f.1"]).is_err());
}

#[test]
fn serve_subcommand_is_accepted() {
    let cli = Cli::try_parse_args(["child-ledger", "serve", "--listen", "0.0.0.0:9000"]).unwrap();
    let Command::Serve(config) = cli.command else {
        panic!("not serve");
    };
    assert_eq!(config.listen.port(), 9000);
}

#[test]
fn serve_flags_without_a_command_serve() {
    let cli = Cli::try_parse_args(["child-ledger", "--listen", "0.0.0.0:9001"]).unwrap();
    let Command::Serve(config) = cli.command else {
        panic!("flags alone are serve's");
    };
    assert_eq!(config.listen.port(), 9001);
    let Command::Reconcile { database, apply, .. } =
        Cli::try_parse_args(["child-ledger", "reconcile", "--database-url", "sqlite://x.db"])
            .unwrap()
            .command
    else {
        panic!("not reconcile");
    };
    assert_eq!((database.database_url.as_str(), apply), ("sqlite://x.db", false));
    // Only serve takes serve's flags.
    for args in [
        &["child-ledger", "openapi", "--listen", "127.0.0.1:1"][..],
        &[
            "child-ledger",
            "token",
            "new",
            "--name",
            "x",
            "--role",
            "admin",
            "--database-url",
            "sqlite://x.db",
        ],
        &["child-ledger", "migrate", "--listen", "127.0.0.1:1"],
    ] {
        assert!(Cli::try_parse_args(args.iter().copied()).is_err(), "{args:?}");
    }
    // The top-level help and version are not serve's.
    for flag in ["--help", "-h", "--version", "help"] {
        let err = Cli::try_parse_args(["child-ledger", flag]).unwrap_err();
        assert!(!err.to_string().contains("--reap-interval-ms"), "{flag}: {err}");
    }
}
