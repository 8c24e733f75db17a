//! Where a completion webhook may go (SSRF), the pure rules: which
//! `webhook_url`s are accepted at registration, and which addresses the
//! sender may connect to once a host name has been resolved.
//!
//! A `webhook_url` is accepted only when every parser reads it alike: it is
//! written exactly as the WHATWG URL parser writes it back (so no numeric
//! IPv4 spellings like `0x7f.1`, no fullwidth dots, no backslashes, no
//! leading space), an HTTP client's parser finds the same host, port and
//! path in it, and it carries no credentials and no fragment. Its host must
//! then be allowed by `--webhook-allow-hosts`. At every attempt the sender
//! resolves the name and connects only to addresses that are public, or
//! that an address or network entry of the list names explicitly.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

/// The entries of `--webhook-allow-hosts`, comma-separated:
/// - `host`, `host:port`, `*.domain`, `*.domain:port`: host names a
///   `webhook_url` may name (the name itself, or any subdomain); what they
///   resolve to must be public unless an address entry allows it;
/// - `address`, `address/prefix`, each with an optional `:port`
///   (`10.1.2.3`, `10.0.0.0/8:9000`, `[::1]:81`, `[fd00::/8]`): addresses a
///   `webhook_url` may name literally, and non-public addresses (loopback,
///   private, link-local, ...) a host name may resolve to.
///
/// Empty: no `webhook_url` is accepted.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct AllowHosts {
    names: Vec<NameEntry>,
    networks: Vec<NetworkEntry>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
struct NameEntry {
    /// Lowercase ASCII (IDNA applied).
    name: String,
    /// `*.name`: any subdomain of `name`, not `name` itself.
    subdomains: bool,
    port: Option<u16>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct NetworkEntry {
    network: Network,
    port: Option<u16>,
}

/// An address block: `address/prefix` (a single address has the full prefix).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Network {
    address: IpAddr,
    prefix: u8,
}

impl Network {
    const fn v4(a: u8, b: u8, c: u8, d: u8, prefix: u8) -> Self {
        Self {
            address: IpAddr::V4(Ipv4Addr::new(a, b, c, d)),
            prefix,
        }
    }

    const fn v6(segments: [u16; 8], prefix: u8) -> Self {
        let [a, b, c, d, e, f, g, h] = segments;
        Self {
            address: IpAddr::V6(Ipv6Addr::new(a, b, c, d, e, f, g, h)),
            prefix,
        }
    }

    pub fn contains(&self, ip: IpAddr) -> bool {
        match (self.address, ip) {
            (IpAddr::V4(net), IpAddr::V4(ip)) => {
                same_prefix(u32::from(net).into(), u32::from(ip).into(), 32, self.prefix)
            }
            (IpAddr::V6(net), IpAddr::V6(ip)) => same_prefix(u128::from(net), u128::from(ip), 128, self.prefix),
            _ => false,
        }
    }

    /// `10.0.0.0/8`, `fd00::/8`: the network address must have no host bits.
    fn parse(text: &str) -> Result<Self, String> {
        let (address, prefix) = match text.split_once('/') {
            Some((address, prefix)) => (address, Some(prefix)),
            None => (text, None),
        };
        let address: IpAddr = address
            .parse()
            .map_err(|_| format!("{text:?} is not an IP address (write IPv4 as four decimal numbers, 10.1.2.3)"))?;
        let width = if address.is_ipv4() { 32 } else { 128 };
        let prefix = match prefix {
            None => width,
            Some(p) => p
                .parse::<u8>()
                .ok()
                .filter(|n| *n <= width && (p == "0" || !p.starts_with('0')))
                .ok_or_else(|| format!("{text:?}: the prefix length must be 0-{width}"))?,
        };
        let network = Self { address, prefix };
        let masked = network.first();
        if masked != address {
            return Err(format!(
                "{text:?} has bits set past its prefix: write {masked}/{prefix}"
            ));
        }
        Ok(network)
    }

    /// The network's first address (its address with the host bits cleared).
    fn first(&self) -> IpAddr {
        match self.address {
            IpAddr::V4(ip) => IpAddr::V4(Ipv4Addr::from(mask(u32::from(ip).into(), 32, self.prefix) as u32)),
            IpAddr::V6(ip) => IpAddr::V6(Ipv6Addr::from(mask(u128::from(ip), 128, self.prefix))),
        }
    }
}

fn mask(bits: u128, width: u32, prefix: u8) -> u128 {
    let host_bits = width - u32::from(prefix);
    if host_bits >= 128 {
        0
    } else {
        bits >> host_bits << host_bits
    }
}

fn same_prefix(a: u128, b: u128, width: u32, prefix: u8) -> bool {
    mask(a, width, prefix) == mask(b, width, prefix)
}

/// The address blocks that are not the public internet, with what each is.
/// An IPv6 address outside global unicast (`2000::/3`) is never public:
/// that covers loopback, unspecified, IPv4-mapped and -compatible, NAT64,
/// discard, unique-local, link-local, site-local and multicast.
const NON_PUBLIC: [(Network, &str); 22] = [
    (Network::v4(0, 0, 0, 0, 8), "\"this network\" (0.0.0.0/8)"),
    (Network::v4(10, 0, 0, 0, 8), "private (10.0.0.0/8)"),
    (
        Network::v4(100, 64, 0, 0, 10),
        "shared address space, carrier-grade NAT (100.64.0.0/10)",
    ),
    (Network::v4(127, 0, 0, 0, 8), "loopback (127.0.0.0/8)"),
    (Network::v4(169, 254, 0, 0, 16), "link-local (169.254.0.0/16)"),
    (Network::v4(172, 16, 0, 0, 12), "private (172.16.0.0/12)"),
    (
        Network::v4(192, 0, 0, 0, 24),
        "IETF protocol assignments (192.0.0.0/24)",
    ),
    (Network::v4(192, 0, 2, 0, 24), "documentation (192.0.2.0/24)"),
    (Network::v4(192, 88, 99, 0, 24), "6to4 relay anycast (192.88.99.0/24)"),
    (Network::v4(192, 168, 0, 0, 16), "private (192.168.0.0/16)"),
    (Network::v4(198, 18, 0, 0, 15), "benchmarking (198.18.0.0/15)"),
    (Network::v4(198, 51, 100, 0, 24), "documentation (198.51.100.0/24)"),
    (Network::v4(203, 0, 113, 0, 24), "documentation (203.0.113.0/24)"),
    (Network::v4(224, 0, 0, 0, 4), "multicast (224.0.0.0/4)"),
    (Network::v4(240, 0, 0, 0, 4), "reserved or broadcast (240.0.0.0/4)"),
    (Network::v6([0, 0, 0, 0, 0, 0, 0, 1], 128), "loopback (::1)"),
    (
        Network::v6([0, 0, 0, 0, 0, 0xffff, 0, 0], 96),
        "IPv4-mapped (::ffff:0:0/96)",
    ),
    (
        Network::v6([0x2001, 0, 0, 0, 0, 0, 0, 0], 23),
        "IETF protocol assignments, Teredo (2001::/23)",
    ),
    (
        Network::v6([0x2001, 0xdb8, 0, 0, 0, 0, 0, 0], 32),
        "documentation (2001:db8::/32)",
    ),
    (Network::v6([0x2002, 0, 0, 0, 0, 0, 0, 0], 16), "6to4 (2002::/16)"),
    (
        Network::v6([0x3fff, 0, 0, 0, 0, 0, 0, 0], 20),
        "documentation (3fff::/20)",
    ),
    (Network::v6([0xfc00, 0, 0, 0, 0, 0, 0, 0], 7), "unique-local (fc00::/7)"),
];

/// What a non-public address is (`None`: a public one).
pub fn non_public(ip: IpAddr) -> Option<&'static str> {
    if let Some((_, what)) = NON_PUBLIC.iter().find(|(net, _)| net.contains(ip)) {
        return Some(what);
    }
    match ip {
        IpAddr::V6(v6) if v6.segments()[0] & 0xe000 != 0x2000 => Some(match v6.segments()[0] {
            0 => "unspecified, IPv4-compatible or otherwise reserved (::/8)",
            0xfe80..=0xfebf => "link-local (fe80::/10)",
            0xfec0..=0xfeff => "site-local (fec0::/10)",
            0xff00..=0xffff => "multicast (ff00::/8)",
            _ => "outside global unicast (2000::/3)",
        }),
        _ => None,
    }
}

/// A `webhook_url` that passed [`AllowHosts::check`]: where to connect, and
/// what to send.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WebhookTarget {
    pub url: url::Url,
    pub https: bool,
    /// The host as the URL names it: a lowercase name, or an address.
    pub host: TargetHost,
    pub port: u16,
    /// The `Host` header: the URL's host and, when not the scheme's default, port.
    pub authority: String,
    /// The request target: path and query.
    pub path_and_query: String,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TargetHost {
    /// Resolved at each attempt; its addresses are checked with [`AllowHosts::may_connect`].
    Name(String),
    /// Named literally: the allow list named it (or its network) explicitly.
    Address(IpAddr),
}

impl AllowHosts {
    /// Comma-separated entries; blanks are ignored. Each entry must be in
    /// its canonical form (lowercase names, decimal dotted IPv4, networks
    /// without host bits): the error names the entry and how to write it.
    pub fn parse(list: &str) -> Result<Self, String> {
        let mut allow = Self::default();
        for entry in list.split(',').map(str::trim).filter(|e| !e.is_empty()) {
            allow
                .add(entry)
                .map_err(|why| format!("--webhook-allow-hosts entry {entry:?}: {why}"))?;
        }
        Ok(allow)
    }

    fn add(&mut self, entry: &str) -> Result<(), String> {
        let (host, port) = split_port(entry)?;
        if let Some(bracketed) = host.strip_prefix('[') {
            let inner = bracketed
                .strip_suffix(']')
                .ok_or("an IPv6 address needs its closing `]`")?;
            if !inner.contains(':') {
                return Err("only IPv6 addresses go in brackets".to_owned());
            }
            let network = Network::parse(inner)?;
            self.networks.push(NetworkEntry { network, port });
            return Ok(());
        }
        let (subdomains, name) = match host.strip_prefix("*.") {
            Some(domain) => (true, domain),
            None => (false, host),
        };
        if name.contains(':') {
            return Err("write an IPv6 address in brackets: [::1], [fd00::/8]:9000".to_owned());
        }
        if name.contains('/') || name.parse::<Ipv4Addr>().is_ok() {
            if subdomains {
                return Err("`*.` goes before a domain name, not an address".to_owned());
            }
            let network = Network::parse(name)?;
            self.networks.push(NetworkEntry { network, port });
            return Ok(());
        }
        // The WHATWG reading of the name, as a URL's host is read (DNS
        // names are case-insensitive: any case is taken as lowercase).
        let name = name.to_ascii_lowercase();
        match url::Host::parse(&name) {
            Ok(url::Host::Domain(domain)) if domain == name => {
                self.names.push(NameEntry {
                    name: domain,
                    subdomains,
                    port,
                });
                Ok(())
            }
            Ok(url::Host::Domain(domain)) => Err(format!("write the name as {domain}")),
            Ok(url::Host::Ipv4(ip)) => Err(format!("this spelling of an address is {ip}: write it so")),
            Ok(url::Host::Ipv6(ip)) => Err(format!("write the address as [{ip}]")),
            Err(e) => Err(format!("not a host name ({e})")),
        }
    }

    pub fn is_empty(&self) -> bool {
        self.names.is_empty() && self.networks.is_empty()
    }

    /// Checks a `webhook_url`: absolute `http`/`https`, read alike by the
    /// URL parser and an HTTP client's, no credentials nor fragment, and a
    /// host the list allows. The error says why not.
    pub fn check(&self, raw: &str) -> Result<WebhookTarget, String> {
        let target = read_alike(raw)?;
        if self.is_empty() {
            return Err("webhooks are not enabled: the service allows no webhook host (--webhook-allow-hosts)".into());
        }
        let allowed = match &target.host {
            TargetHost::Name(name) => self.names.iter().any(|entry| entry.allows(name, target.port)),
            TargetHost::Address(ip) => self.named_explicitly(*ip, target.port),
        };
        if allowed {
            Ok(target)
        } else {
            Err(format!(
                "host {}:{} is not in --webhook-allow-hosts",
                authority_host(&target.authority),
                target.port
            ))
        }
    }

    /// Whether the sender may connect to `ip`:`port`, an address a host name
    /// resolved to: a public one, or one an address entry names. The error
    /// says what the address is.
    pub fn may_connect(&self, ip: IpAddr, port: u16) -> Result<(), String> {
        match non_public(ip) {
            Some(what) if !self.named_explicitly(ip, port) => Err(format!(
                "{ip} is {what}: not reached unless --webhook-allow-hosts names that address or network"
            )),
            _ => Ok(()),
        }
    }

    fn named_explicitly(&self, ip: IpAddr, port: u16) -> bool {
        self.networks
            .iter()
            .any(|entry| entry.network.contains(ip) && entry.port.is_none_or(|p| p == port))
    }
}

impl NameEntry {
    fn allows(&self, host: &str, port: u16) -> bool {
        if self.port.is_some_and(|p| p != port) {
            return false;
        }
        if !self.subdomains {
            return host == self.name;
        }
        host.len() > self.name.len() + 1
            && host.ends_with(self.name.as_str())
            && host.as_bytes()[host.len() - self.name.len() - 1] == b'.'
    }
}

/// `host:port` → (`host`, port); a colon inside IPv6 brackets is not a port's.
fn split_port(entry: &str) -> Result<(&str, Option<u16>), String> {
    let cut = match entry.rfind(':') {
        Some(at) if !entry[at..].contains(']') && (entry.starts_with('[') || entry[..at].find(':').is_none()) => at,
        _ => return Ok((entry, None)),
    };
    let port = &entry[cut + 1..];
    let port = port
        .parse::<u16>()
        .ok()
        .filter(|p| *p != 0 && !port.starts_with('0'))
        .ok_or_else(|| format!("{port:?} is not a port (1-65535)"))?;
    Ok((&entry[..cut], Some(port)))
}

/// Reads `raw` as the WHATWG URL parser does and as an HTTP client does,
/// refusing it unless both agree and it is written in its canonical form.
fn read_alike(raw: &str) -> Result<WebhookTarget, String> {
    let url = url::Url::parse(raw).map_err(|e| format!("not an absolute URL ({e})"))?;
    let https = match url.scheme() {
        "https" => true,
        "http" => false,
        _ => return Err("must be an http or https URL".to_owned()),
    };
    if !url.username().is_empty() || url.password().is_some() {
        return Err("must not carry credentials".to_owned());
    }
    if url.fragment().is_some() {
        return Err("must not have a fragment (#…): it is never sent".to_owned());
    }
    if url.as_str() != raw {
        // Different spellings of one URL (other IPv4 notations, fullwidth
        // dots, backslashes, blanks, case, default ports) are where parsers
        // disagree: only the one every parser reads alike is taken.
        return Err(format!(
            "must be written as a URL parser writes it back: {}",
            url.as_str()
        ));
    }
    let host = match url.host() {
        Some(url::Host::Domain(name)) => TargetHost::Name(name.to_owned()),
        Some(url::Host::Ipv4(ip)) => TargetHost::Address(IpAddr::V4(ip)),
        Some(url::Host::Ipv6(ip)) => TargetHost::Address(IpAddr::V6(ip)),
        None => return Err("must name a host".to_owned()),
    };
    let port = url.port_or_known_default().ok_or("must name a port")?;
    let authority = url[url::Position::BeforeHost..url::Position::AfterPort].to_owned();
    let path_and_query = url[url::Position::BeforePath..url::Position::AfterQuery].to_owned();
    // And as the HTTP client reads it.
    let uri: hyper::Uri = raw
        .parse()
        .map_err(|e| format!("is read differently by HTTP clients ({e})"))?;
    let client_port = uri.port_u16().unwrap_or(if https { 443 } else { 80 });
    let agrees = uri.scheme_str() == Some(url.scheme())
        && uri.authority().map(|a| a.as_str()) == Some(authority.as_str())
        && client_port == port
        && uri.path_and_query().map(|p| p.as_str()) == Some(path_and_query.as_str());
    if !agrees {
        return Err("is read differently by HTTP clients (host, port or path)".to_owned());
    }
    Ok(WebhookTarget {
        url,
        https,
        host,
        port,
        authority,
        path_and_query,
    })
}

/// The host part of `host[:port]` (IPv6 with its brackets).
fn authority_host(authority: &str) -> String {
    match authority.rfind(':') {
        Some(at) if !authority[at..].contains(']') => authority[..at].to_owned(),
        _ => authority.to_owned(),
    }
}

/// `url` with its query string, whose values may be secrets (a receiver's
/// token), replaced by `redacted`: what a caller who may not see the secret
/// is shown. Credentials are never accepted, so there are none to hide.
pub fn redact_url(url: &str) -> String {
    match url.split_once('?') {
        Some((before, _)) => format!("{before}?redacted"),
        None => url.to_owned(),
    }
}

#[cfg(test)]
mod tests;
