use super::*;

fn allow(list: &str) -> AllowHosts {
    AllowHosts::parse(list).unwrap()
}

#[test]
fn hosts_match_exactly_by_port_or_by_subdomain() {
    let allow = allow("hooks.example.com, 127.0.0.1:9000 ,*.corp.test,[::1]:81");
    assert!(allow.check("https://hooks.example.com/x").is_ok());
    assert!(allow.check("http://hooks.example.com:8080/x").is_ok());
    assert!(allow.check("http://127.0.0.1:9000/").is_ok());
    assert!(allow.check("http://127.0.0.1:9001/").is_err());
    assert!(allow.check("https://a.b.corp.test/").is_ok());
    assert!(allow.check("https://corp.test/").is_err());
    assert!(allow.check("https://evilcorp.test/").is_err());
    assert!(allow.check("http://[::1]:81/").is_ok());
    assert!(allow.check("ftp://hooks.example.com/").is_err());
    assert!(allow.check("https://u:p@hooks.example.com/").is_err());
    assert!(allow.check("/relative").is_err());
    assert!(allow.check("https://hooks.example.com.evil.test/").is_err());
    assert!(
        AllowHosts::parse("")
            .unwrap()
            .check("https://hooks.example.com/")
            .is_err()
    );
    let target = allow.check("http://hooks.example.com:8080/x?a=1").unwrap();
    assert_eq!(target.authority, "hooks.example.com:8080");
    assert_eq!(target.path_and_query, "/x?a=1");
    assert_eq!(target.host, TargetHost::Name("hooks.example.com".to_owned()));
    let target = allow.check("http://[::1]:81/").unwrap();
    assert_eq!(target.host, TargetHost::Address("::1".parse().unwrap()));
    assert_eq!((target.authority.as_str(), target.port), ("[::1]:81", 81));
}

#[test]
fn other_spellings_of_an_address_or_a_name_are_refused() {
    let allow = allow("127.0.0.1, hooks.example.com");
    assert!(allow.check("http://127.0.0.1/").is_ok());
    for raw in [
        "http://2130706433/",
        "http://0x7f000001/",
        "http://0x7f.1/",
        "http://017700000001/",
        "http://127.1/",
        "http://127.0.0.1",
        "http://127.0.0.1:80/",
        "http://h\\@127.0.0.1/",
        "http://h\\@hooks.example.com/",
        "http://hooks\u{ff0e}example\u{ff0e}com/",
        " http://hooks.example.com/",
        "http://hooks.example.com/\n",
        "http://HOOKS.example.com/",
        "http://hooks.example.com/a b",
        "http://hooks.example.com/#frag",
        "http://user@hooks.example.com/",
        "http:hooks.example.com/",
        "http://hooks.example.com%2f@127.0.0.1/",
    ] {
        let why = allow.check(raw).expect_err(raw);
        assert!(!why.is_empty(), "{raw}");
    }
    assert!(
        allow.check("http://0x7f.1/").unwrap_err().contains("http://127.0.0.1/"),
        "the refusal shows the form to write"
    );
}

#[test]
fn entries_are_canonical_and_networks_explicit() {
    for bad in [
        "127.1",
        "0x7f.1",
        "2130706433",
        "10.1.2.3/8",
        "10.0.0.0/33",
        "::1",
        "[127.0.0.1]",
        "*.10.0.0.0/8",
        "hooks\u{ff0e}example.com",
        "h:0",
        "h:x",
        "a b",
    ] {
        assert!(AllowHosts::parse(bad).is_err(), "{bad}");
    }
    let allow = allow("10.0.0.0/8:9000, [fd00::/8], 192.168.1.7");
    assert!(allow.check("http://10.1.2.3:9000/").is_ok());
    assert!(allow.check("http://10.1.2.3:9001/").is_err());
    assert!(allow.check("http://[fd12::1]/").is_ok());
    assert!(allow.check("http://192.168.1.7/").is_ok());
    assert!(allow.check("http://192.168.1.8/").is_err());
    assert!(allow.may_connect("10.9.9.9".parse().unwrap(), 9000).is_ok());
    assert!(allow.may_connect("10.9.9.9".parse().unwrap(), 80).is_err());
    assert!(allow.may_connect("fd00::5".parse().unwrap(), 443).is_ok());
    assert!(allow.may_connect("93.184.216.34".parse().unwrap(), 443).is_ok());
    assert!(allow.may_connect("127.0.0.1".parse().unwrap(), 443).is_err());
    // A public address named literally needs an entry too.
    assert!(allow.check("http://93.184.216.34/").is_err());
}

#[test]
fn non_public_addresses_are_named() {
    for (ip, what) in [
        ("0.1.2.3", "this network"),
        ("10.0.0.1", "private"),
        ("100.64.0.1", "carrier-grade"),
        ("100.127.255.255", "carrier-grade"),
        ("127.0.0.1", "loopback"),
        ("127.255.0.9", "loopback"),
        ("169.254.169.254", "link-local"),
        ("172.16.0.1", "private"),
        ("172.31.255.255", "private"),
        ("192.168.0.1", "private"),
        ("224.0.0.1", "multicast"),
        ("255.255.255.255", "broadcast"),
        ("198.18.0.1", "benchmarking"),
        ("::1", "loopback"),
        ("::", "unspecified"),
        ("::ffff:127.0.0.1", "IPv4-mapped"),
        ("::ffff:8.8.8.8", "IPv4-mapped"),
        ("::127.0.0.1", "IPv4-compatible"),
        ("64:ff9b::7f00:1", "outside global unicast"),
        ("fe80::1", "link-local"),
        ("fd00::1", "unique-local"),
        ("fc00::1", "unique-local"),
        ("ff02::1", "multicast"),
        ("2001:db8::1", "documentation"),
        ("2002:7f00:1::", "6to4"),
        ("2001::1", "Teredo"),
    ] {
        let ip: IpAddr = ip.parse().unwrap();
        let found = non_public(ip).unwrap_or_else(|| panic!("{ip} is not public"));
        assert!(found.contains(what), "{ip}: {found}");
    }
    for ip in [
        "8.8.8.8",
        "93.184.216.34",
        "100.63.255.255",
        "100.128.0.0",
        "172.32.0.1",
        "2606:4700::1111",
        "2a00:1450:4001::1",
    ] {
        let ip: IpAddr = ip.parse().unwrap();
        assert_eq!(non_public(ip), None, "{ip}");
    }
}

#[test]
fn a_query_string_is_redacted() {
    assert_eq!(
        redact_url("https://h.example/hook?token=s3cret&x=1"),
        "https://h.example/hook?redacted"
    );
    assert_eq!(redact_url("https://h.example/hook"), "https://h.example/hook");
}
