//! Egress for a sandbox session that names allowed hosts (the `agent` runner's `allowedHosts`).
//!
//! The session's network namespace keeps only its loopback interface: nothing inside can
//! reach an address of its own. When the case names hosts, the host process opens a listening
//! socket *inside* that namespace ([`listen_in`]: a short-lived thread joins the namespace with
//! `setns`, binds `127.0.0.1:`[`PROXY_PORT`] and exits) and serves an HTTP proxy on it from
//! outside; the sandbox gets `HTTP_PROXY`/`HTTPS_PROXY` pointing at it. The proxy:
//! - answers `CONNECT host:port` (HTTPS and any other TCP tunnel) and absolute-form `http://`
//!   requests, and nothing else;
//! - refuses (403, naming the host) a host the case did not allow;
//! - resolves the name itself and connects to the address it resolved (no rebinding between
//!   check and connect), and refuses loopback, private, link-local and other non-public
//!   addresses unless the sandbox policy's `allow_private_egress` says otherwise, so a skill
//!   cannot aim an allowed name at the worker's own network or a cloud metadata endpoint.
//!
//! Programs that ignore the proxy variables get no network at all. Joining another network
//! namespace needs `CAP_SYS_ADMIN`: the worker runs as root for its sandbox uids; a host without
//! it gets [`EgressError::Setup`], a configuration problem, not a failing skill.
//!
//! The HTTP handling is hyper's (server with upgrades for `CONNECT`, client connection for
//! plain requests); what is written here is only the policy.

use std::convert::Infallible;
use std::fs::File;
use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::time::Duration;

use http_body_util::combinators::BoxBody;
use http_body_util::{BodyExt, Full};
use hyper::body::{Bytes, Incoming};
use hyper::service::service_fn;
use hyper::{Method, Request, Response, StatusCode};
use hyper_util::rt::TokioIo;
use tokio::net::TcpStream;
use tokio::sync::watch;

/// The proxy's port on the sandbox's loopback (each sandbox has a namespace of its own).
pub const PROXY_PORT: u16 = 3128;
/// How long resolving and connecting to an allowed host may take.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);

/// One `allowedHosts` entry: a host name or address, `*.` for any subdomain, an optional port.
#[derive(Debug, Clone, PartialEq, Eq)]
struct HostRule {
    host: String,
    subdomains: bool,
    port: Option<u16>,
}

/// The hosts a case may reach, parsed from `allowedHosts`.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct AllowedHosts {
    rules: Vec<HostRule>,
}

impl AllowedHosts {
    /// Parses the entries: `example.com`, `*.example.com`, `example.com:8443`, `10.1.2.3`,
    /// `[::1]:8080`. The error names the entry and the rule it breaks.
    pub fn parse(entries: &[String]) -> Result<Self, String> {
        let mut rules = Vec::new();
        for raw in entries {
            let entry = raw.trim().to_ascii_lowercase();
            let bad = |why: &str| format!("entry `{raw}`: {why}");
            let (host, port) = if let Some(rest) = entry.strip_prefix('[') {
                let (addr, after) = rest
                    .split_once(']')
                    .ok_or_else(|| bad("an IPv6 address in brackets needs its `]`"))?;
                let port = match after.strip_prefix(':') {
                    Some(p) => Some(p),
                    None if after.is_empty() => None,
                    None => return Err(bad("only `:PORT` may follow `]`")),
                };
                (addr.to_string(), port)
            } else if entry.matches(':').count() > 1 {
                // A bare IPv6 address.
                (entry.clone(), None)
            } else {
                match entry.split_once(':') {
                    Some((h, p)) => (h.to_string(), Some(p)),
                    None => (entry.clone(), None),
                }
            };
            let port = port
                .map(|p| {
                    p.parse::<u16>()
                        .ok()
                        .filter(|p| *p > 0)
                        .ok_or_else(|| bad("the port must be a number from 1 to 65535"))
                })
                .transpose()?;
            let (host, subdomains) = match host.strip_prefix("*.") {
                Some(h) => (h.to_string(), true),
                None => (host, false),
            };
            if host.is_empty() {
                return Err(bad("give a host name or an address"));
            }
            if host.parse::<IpAddr>().is_err() {
                let label_ok = |l: &str| {
                    !l.is_empty()
                        && l.len() <= 63
                        && !l.starts_with('-')
                        && !l.ends_with('-')
                        && l.chars().all(|c| c.is_ascii_alphanumeric() || c == '-')
                };
                if host.len() > 253 || !host.split('.').all(label_ok) {
                    return Err(bad(
                        "a host name is dot-separated labels of letters, digits and `-` (a leading `*.` allows its subdomains)",
                    ));
                }
            } else if subdomains {
                return Err(bad("`*.` goes with a host name, not an address"));
            }
            rules.push(HostRule {
                host,
                subdomains,
                port,
            });
        }
        Ok(AllowedHosts { rules })
    }

    pub fn is_empty(&self) -> bool {
        self.rules.is_empty()
    }

    /// Whether `host:port` matches an entry (`host` lower-case, without brackets).
    pub fn allows(&self, host: &str, port: u16) -> bool {
        self.rules.iter().any(|r| {
            let name = if r.subdomains {
                host.strip_suffix(r.host.as_str())
                    .is_some_and(|head| head.ends_with('.') && head.len() > 1)
            } else {
                host == r.host
            };
            name && r.port.is_none_or(|p| p == port)
        })
    }
}

/// Whether an address is one a sandbox may not reach unless the policy allows private egress:
/// loopback, private, shared (CGNAT), link-local (cloud metadata), unspecified, multicast,
/// broadcast, documentation and benchmarking ranges, IPv6 unique-local and link-local, and
/// IPv4 addresses mapped into IPv6.
pub fn is_private(ip: IpAddr) -> bool {
    match ip {
        IpAddr::V4(v4) => {
            let o = v4.octets();
            v4.is_loopback()
                || v4.is_private()
                || v4.is_link_local()
                || v4.is_unspecified()
                || v4.is_multicast()
                || v4.is_broadcast()
                || v4.is_documentation()
                || o[0] == 0
                || (o[0] == 100 && (o[1] & 0xc0) == 64)
                || (o[0] == 198 && (o[1] & 0xfe) == 18)
                || o[0] >= 240
        }
        IpAddr::V6(v6) => {
            let s = v6.segments();
            match v6.to_ipv4_mapped() {
                Some(v4) => is_private(IpAddr::V4(v4)),
                None => {
                    v6.is_loopback()
                        || v6.is_unspecified()
                        || v6.is_multicast()
                        || (s[0] & 0xfe00) == 0xfc00
                        || (s[0] & 0xffc0) == 0xfe80
                        || (s[0] == 0x2001 && s[1] == 0x0db8)
                }
            }
        }
    }
}

/// Why a session's egress could not be set up.
#[derive(Debug, thiserror::Error)]
pub enum EgressError {
    #[error("cannot open the allowed-hosts proxy inside the sandbox's network namespace: {0} (joining it needs CAP_SYS_ADMIN: run the worker as root, or drop `allowedHosts`)")]
    Setup(String),
}

/// A listening socket on `127.0.0.1:port` inside the network namespace of process `pid`.
///
/// A dedicated thread joins the namespace, binds and ends: a socket belongs to the namespace
/// it was created in, and no thread of the runtime ever changes namespace.
pub async fn listen_in(pid: u32, port: u16) -> Result<tokio::net::TcpListener, EgressError> {
    let ns = File::open(format!("/proc/{pid}/ns/net"))
        .map_err(|e| EgressError::Setup(format!("opening /proc/{pid}/ns/net: {e}")))?;
    let (tx, rx) = tokio::sync::oneshot::channel();
    std::thread::spawn(move || {
        let bound = nix::sched::setns(&ns, nix::sched::CloneFlags::CLONE_NEWNET)
            .map_err(|e| format!("setns: {e}"))
            .and_then(|()| {
                let l = std::net::TcpListener::bind(("127.0.0.1", port))
                    .map_err(|e| format!("binding 127.0.0.1:{port}: {e}"))?;
                l.set_nonblocking(true)
                    .map_err(|e| format!("binding 127.0.0.1:{port}: {e}"))?;
                Ok(l)
            });
        let _ = tx.send(bound);
    });
    let std_listener = rx
        .await
        .map_err(|_| EgressError::Setup("the namespace thread ended without an answer".into()))?
        .map_err(EgressError::Setup)?;
    tokio::net::TcpListener::from_std(std_listener).map_err(|e| EgressError::Setup(e.to_string()))
}

/// The proxy of one session; dropping it stops the proxy and every tunnel it opened.
#[derive(Debug)]
pub struct EgressProxy {
    task: tokio::task::JoinHandle<()>,
    _closed: watch::Sender<()>,
}

impl Drop for EgressProxy {
    fn drop(&mut self) {
        self.task.abort();
    }
}

struct Policy {
    hosts: AllowedHosts,
    allow_private: bool,
    closed: watch::Receiver<()>,
}

type ProxyBody = BoxBody<Bytes, hyper::Error>;

impl EgressProxy {
    /// Serves the proxy on `listener` until dropped.
    pub fn serve(
        listener: tokio::net::TcpListener,
        hosts: AllowedHosts,
        allow_private: bool,
    ) -> EgressProxy {
        let (closed_tx, closed) = watch::channel(());
        let policy = Arc::new(Policy {
            hosts,
            allow_private,
            closed,
        });
        let task = tokio::spawn(async move {
            loop {
                let stream = match listener.accept().await {
                    Ok((stream, _)) => stream,
                    Err(e) => {
                        // Out of descriptors, say: wait rather than spin on the error.
                        tracing::warn!(error = %e, "sandbox proxy: accept failed");
                        tokio::time::sleep(Duration::from_millis(100)).await;
                        continue;
                    }
                };
                let policy = policy.clone();
                let mut closed = policy.closed.clone();
                tokio::spawn(async move {
                    let svc = service_fn(move |req| handle(req, policy.clone()));
                    let conn = hyper::server::conn::http1::Builder::new()
                        .serve_connection(TokioIo::new(stream), svc)
                        .with_upgrades();
                    tokio::select! {
                        _ = conn => {}
                        _ = closed.changed() => {}
                    }
                });
            }
        });
        EgressProxy {
            task,
            _closed: closed_tx,
        }
    }
}

fn text(status: StatusCode, body: String) -> Response<ProxyBody> {
    let mut resp = Response::new(
        Full::new(Bytes::from(body + "\n"))
            .map_err(|never| match never {})
            .boxed(),
    );
    *resp.status_mut() = status;
    resp
}

async fn handle(
    req: Request<Incoming>,
    policy: Arc<Policy>,
) -> Result<Response<ProxyBody>, Infallible> {
    if req.method() == Method::CONNECT {
        let Some(authority) = req.uri().authority().cloned() else {
            return Ok(text(
                StatusCode::BAD_REQUEST,
                "skilleval sandbox proxy: CONNECT needs host:port".into(),
            ));
        };
        let port = authority.port_u16().unwrap_or(443);
        let upstream = match connect(&policy, authority.host(), port).await {
            Ok(s) => s,
            Err(resp) => return Ok(resp),
        };
        let mut closed = policy.closed.clone();
        tokio::spawn(async move {
            if let Ok(upgraded) = hyper::upgrade::on(req).await {
                let mut client = TokioIo::new(upgraded);
                let mut upstream = upstream;
                tokio::select! {
                    _ = tokio::io::copy_bidirectional(&mut client, &mut upstream) => {}
                    _ = closed.changed() => {}
                }
            }
        });
        return Ok(Response::new(
            http_body_util::Empty::new()
                .map_err(|never| match never {})
                .boxed(),
        ));
    }
    let uri = req.uri().clone();
    let (Some("http"), Some(host)) = (uri.scheme_str(), uri.host()) else {
        return Ok(text(
            StatusCode::BAD_REQUEST,
            format!("skilleval sandbox proxy: `{uri}` is not an absolute http:// URL (https goes through CONNECT)"),
        ));
    };
    let port = uri.port_u16().unwrap_or(80);
    let upstream = match connect(&policy, host, port).await {
        Ok(s) => s,
        Err(resp) => return Ok(resp),
    };
    let (mut sender, conn) =
        match hyper::client::conn::http1::handshake(TokioIo::new(upstream)).await {
            Ok(pair) => pair,
            Err(e) => {
                return Ok(text(
                    StatusCode::BAD_GATEWAY,
                    format!("skilleval sandbox proxy: {host}:{port}: {e}"),
                ))
            }
        };
    let mut closed = policy.closed.clone();
    tokio::spawn(async move {
        tokio::select! {
            _ = conn => {}
            _ = closed.changed() => {}
        }
    });
    let (mut parts, body) = req.into_parts();
    parts.uri = uri
        .path_and_query()
        .map_or_else(|| "/".to_string(), |pq| pq.as_str().to_string())
        .parse()
        .unwrap_or_default();
    parts.headers.remove("proxy-connection");
    parts.headers.remove("proxy-authorization");
    match sender.send_request(Request::from_parts(parts, body)).await {
        Ok(resp) => Ok(resp.map(BodyExt::boxed)),
        Err(e) => Ok(text(
            StatusCode::BAD_GATEWAY,
            format!("skilleval sandbox proxy: {host}:{port}: {e}"),
        )),
    }
}

/// A connection to an allowed `host:port` at an address the policy permits, or the response
/// that says why not.
async fn connect(policy: &Policy, host: &str, port: u16) -> Result<TcpStream, Response<ProxyBody>> {
    let host = host
        .trim_start_matches('[')
        .trim_end_matches(']')
        .to_ascii_lowercase();
    if !policy.hosts.allows(&host, port) {
        return Err(text(
            StatusCode::FORBIDDEN,
            format!("skilleval sandbox proxy: {host}:{port} is not in the case's allowedHosts"),
        ));
    }
    let resolved: Vec<SocketAddr> = match tokio::time::timeout(
        CONNECT_TIMEOUT,
        tokio::net::lookup_host((host.as_str(), port)),
    )
    .await
    {
        Ok(Ok(addrs)) => addrs.collect(),
        Ok(Err(e)) => {
            return Err(text(
                StatusCode::BAD_GATEWAY,
                format!("skilleval sandbox proxy: cannot resolve {host}: {e}"),
            ))
        }
        Err(_) => {
            return Err(text(
                StatusCode::GATEWAY_TIMEOUT,
                format!("skilleval sandbox proxy: resolving {host} timed out"),
            ))
        }
    };
    let permitted: Vec<SocketAddr> = resolved
        .iter()
        .copied()
        .filter(|a| policy.allow_private || !is_private(a.ip()))
        .collect();
    if permitted.is_empty() {
        return Err(text(
            StatusCode::FORBIDDEN,
            format!(
                "skilleval sandbox proxy: {host} resolves only to private or local addresses ({}), which the sandbox policy refuses (sandbox.allow_private_egress)",
                resolved.iter().map(|a| a.ip().to_string()).collect::<Vec<_>>().join(", ")
            ),
        ));
    }
    let mut last = String::new();
    for addr in permitted {
        match tokio::time::timeout(CONNECT_TIMEOUT, TcpStream::connect(addr)).await {
            Ok(Ok(s)) => return Ok(s),
            Ok(Err(e)) => last = format!("{addr}: {e}"),
            Err(_) => last = format!("{addr}: timed out"),
        }
    }
    Err(text(
        StatusCode::BAD_GATEWAY,
        format!("skilleval sandbox proxy: cannot connect to {host}:{port} ({last})"),
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hosts(list: &[&str]) -> AllowedHosts {
        AllowedHosts::parse(&list.iter().map(|s| s.to_string()).collect::<Vec<_>>())
            .expect("valid entries")
    }

    #[test]
    fn entries_match_names_subdomains_and_ports() {
        let h = hosts(&[
            "API.example.com",
            "*.cdn.io",
            "files.net:8443",
            "[::1]:8080",
            "10.0.0.5",
        ]);
        assert!(h.allows("api.example.com", 443));
        assert!(!h.allows("example.com", 443));
        assert!(!h.allows("evilapi.example.com", 443));
        assert!(h.allows("a.cdn.io", 80));
        assert!(h.allows("a.b.cdn.io", 80));
        assert!(!h.allows("cdn.io", 80), "`*.` is subdomains only");
        assert!(!h.allows("xcdn.io", 80));
        assert!(h.allows("files.net", 8443));
        assert!(!h.allows("files.net", 443));
        assert!(h.allows("::1", 8080));
        assert!(!h.allows("::1", 80));
        assert!(h.allows("10.0.0.5", 22));
    }

    #[test]
    fn bad_entries_are_named_with_their_rule() {
        for (entry, rule) in [
            ("", "give a host name"),
            ("exa mple.com", "dot-separated labels"),
            ("example.com:0", "1 to 65535"),
            ("example.com:http", "1 to 65535"),
            ("*.10.0.0.1", "not an address"),
            ("[::1", "`]`"),
            ("-x.com", "dot-separated labels"),
        ] {
            let err = AllowedHosts::parse(&[entry.to_string()]).expect_err(entry);
            assert!(err.contains(&format!("`{entry}`")), "{err}");
            assert!(err.contains(rule), "{entry}: {err}");
        }
    }

    #[test]
    fn private_and_local_addresses_are_recognised() {
        for ip in [
            "127.0.0.1",
            "10.1.2.3",
            "172.16.0.1",
            "192.168.1.1",
            "169.254.169.254",
            "0.0.0.0",
            "100.64.0.1",
            "198.18.0.1",
            "224.0.0.1",
            "255.255.255.255",
            "::1",
            "fd00::1",
            "fe80::1",
            "::ffff:127.0.0.1",
            "::ffff:10.0.0.1",
            "2001:db8::1",
        ] {
            assert!(is_private(ip.parse().expect(ip)), "{ip} is private");
        }
        for ip in [
            "93.184.215.14",
            "8.8.8.8",
            "172.32.0.1",
            "100.128.0.1",
            "2606:4700::1111",
        ] {
            assert!(!is_private(ip.parse().expect(ip)), "{ip} is public");
        }
    }
}
