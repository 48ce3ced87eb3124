//! Discovery by DNS: each node answers its pods' queries for names under
//! `corral.` from a table the agent keeps (`NAME.NAMESPACE.pod.corral.` →
//! the pod's AAAA, `NAME.NAMESPACE.pd.corral.` → the AAAA records of a
//! PinnedDeployment's ready pods) and forwards everything else to the
//! node's own resolver. Messages are parsed and built with `hickory-proto`;
//! the server is a small UDP loop (pods' resolvers use UDP for these
//! answers, which stay far below 512 bytes for ordinary deployments).
//!
//! [`answer`] is pure; [`serve`] does the I/O.

use std::collections::BTreeMap;
use std::net::{Ipv6Addr, SocketAddr};
use std::sync::{Arc, RwLock};
use std::time::Duration;

use hickory_proto::op::{Message, MessageType, OpCode, ResponseCode};
use hickory_proto::rr::rdata::AAAA;
use hickory_proto::rr::{RData, Record, RecordType};
use tokio::net::UdpSocket;
use tokio_util::sync::CancellationToken;

/// The cluster's DNS zone.
pub const ZONE: &str = "corral.";
/// TTL of the records corral answers: short, since pods come and go.
pub const TTL: u32 = 5;
/// How long a forwarded query may take.
pub const FORWARD_TIMEOUT: Duration = Duration::from_secs(3);

/// Names under [`ZONE`] and their addresses; names are lowercase, fully
/// qualified (trailing dot).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct DnsTable {
    names: BTreeMap<String, Vec<Ipv6Addr>>,
}

impl DnsTable {
    pub fn new() -> Self {
        Self::default()
    }

    /// `NAME.NAMESPACE.pod.corral.` → `address`.
    pub fn add_pod(&mut self, namespace: &str, name: &str, address: Ipv6Addr) {
        self.add(format!("{name}.{namespace}.pod.{ZONE}"), address);
    }

    /// `NAME.NAMESPACE.pd.corral.` gains `address` (one per ready pod).
    pub fn add_deployment_pod(&mut self, namespace: &str, name: &str, address: Ipv6Addr) {
        self.add(format!("{name}.{namespace}.pd.{ZONE}"), address);
    }

    /// Makes `NAME.NAMESPACE.pd.corral.` known even with no ready pod
    /// (it then answers with no records rather than NXDOMAIN).
    pub fn add_deployment(&mut self, namespace: &str, name: &str) {
        self.names
            .entry(format!("{name}.{namespace}.pd.{ZONE}").to_ascii_lowercase())
            .or_default();
    }

    fn add(&mut self, name: String, address: Ipv6Addr) {
        let entry = self.names.entry(name.to_ascii_lowercase()).or_default();
        if !entry.contains(&address) {
            entry.push(address);
            entry.sort();
        }
    }

    pub fn lookup(&self, name: &str) -> Option<&[Ipv6Addr]> {
        self.names
            .get(&name.to_ascii_lowercase())
            .map(Vec::as_slice)
    }
}

/// What to do with one incoming message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Answer {
    /// Send these bytes back.
    Reply(Vec<u8>),
    /// Not ours: relay the query to the node's resolver.
    Forward,
    /// Not a DNS query at all: drop it.
    Drop,
}

/// Answers a query from the table, or says to forward it.
pub fn answer(query: &[u8], table: &DnsTable) -> Answer {
    let Ok(request) = Message::from_vec(query) else {
        return Answer::Drop;
    };
    if request.message_type() != MessageType::Query {
        return Answer::Drop;
    }
    let Some(question) = request.queries().first() else {
        return reply(error(&request, ResponseCode::FormErr));
    };
    let name = question.name().to_ascii();
    let name = if name.ends_with('.') {
        name
    } else {
        format!("{name}.")
    };
    let in_zone =
        name.eq_ignore_ascii_case(ZONE) || name.to_ascii_lowercase().ends_with(&format!(".{ZONE}"));
    if !in_zone {
        return Answer::Forward;
    }
    if request.op_code() != OpCode::Query {
        return reply(error(&request, ResponseCode::NotImp));
    }
    let mut response = Message::new();
    response
        .set_id(request.id())
        .set_message_type(MessageType::Response)
        .set_op_code(OpCode::Query)
        .set_authoritative(true)
        .set_recursion_desired(request.recursion_desired())
        .set_recursion_available(true)
        .add_query(question.clone());
    match table.lookup(&name) {
        None => {
            response.set_response_code(ResponseCode::NXDomain);
        }
        Some(addresses) => {
            response.set_response_code(ResponseCode::NoError);
            if matches!(question.query_type(), RecordType::AAAA | RecordType::ANY) {
                for address in addresses {
                    response.add_answer(Record::from_rdata(
                        question.name().clone(),
                        TTL,
                        RData::AAAA(AAAA(*address)),
                    ));
                }
            }
        }
    }
    reply(response)
}

fn error(request: &Message, code: ResponseCode) -> Message {
    let mut response = Message::error_msg(request.id(), request.op_code(), code);
    response.add_queries(request.queries().iter().cloned());
    response
}

fn reply(message: Message) -> Answer {
    match message.to_vec() {
        Ok(bytes) => Answer::Reply(bytes),
        Err(_) => Answer::Drop,
    }
}

/// The first `nameserver` of a `resolv.conf` text, on port 53.
pub fn upstream_from_resolv_conf(text: &str) -> Option<SocketAddr> {
    text.lines()
        .filter_map(|line| line.trim().strip_prefix("nameserver"))
        .filter_map(|rest| rest.trim().parse::<std::net::IpAddr>().ok())
        .map(|ip| SocketAddr::new(ip, 53))
        .next()
}

/// The `resolv.conf` pods get: the node's DNS address, the pod's own
/// namespace searched first.
pub fn pod_resolv_conf(server: Ipv6Addr, namespace: &str) -> String {
    format!(
        "nameserver {server}\nsearch {namespace}.pod.{zone} {namespace}.pd.{zone}\noptions ndots:3\n",
        zone = ZONE.trim_end_matches('.')
    )
}

/// Serves DNS on `socket` until `shutdown` resolves: answers from `table`,
/// relays the rest to `upstream` (or refuses it when there is none).
pub async fn serve(
    socket: UdpSocket,
    table: Arc<RwLock<DnsTable>>,
    upstream: Option<SocketAddr>,
    shutdown: CancellationToken,
) {
    let socket = Arc::new(socket);
    let mut buffer = vec![0u8; 4096];
    loop {
        let received = tokio::select! {
            received = socket.recv_from(&mut buffer) => received,
            () = shutdown.cancelled() => return,
        };
        let Ok((length, client)) = received else {
            continue;
        };
        let query = buffer[..length].to_vec();
        let decided = {
            let table = table.read().unwrap_or_else(|p| p.into_inner());
            answer(&query, &table)
        };
        match decided {
            Answer::Reply(bytes) => {
                let _ = socket.send_to(&bytes, client).await;
            }
            Answer::Drop => {}
            Answer::Forward => {
                let socket = socket.clone();
                tokio::spawn(async move {
                    let bytes = match upstream {
                        Some(upstream) => forward(&query, upstream).await,
                        None => None,
                    };
                    let bytes = bytes.or_else(|| {
                        let request = Message::from_vec(&query).ok()?;
                        error(&request, ResponseCode::ServFail).to_vec().ok()
                    });
                    if let Some(bytes) = bytes {
                        let _ = socket.send_to(&bytes, client).await;
                    }
                });
            }
        }
    }
}

async fn forward(query: &[u8], upstream: SocketAddr) -> Option<Vec<u8>> {
    let bind: SocketAddr = if upstream.is_ipv4() {
        "0.0.0.0:0".parse().ok()?
    } else {
        "[::]:0".parse().ok()?
    };
    let socket = UdpSocket::bind(bind).await.ok()?;
    socket.connect(upstream).await.ok()?;
    socket.send(query).await.ok()?;
    let mut buffer = vec![0u8; 4096];
    let length = tokio::time::timeout(FORWARD_TIMEOUT, socket.recv(&mut buffer))
        .await
        .ok()?
        .ok()?;
    buffer.truncate(length);
    Some(buffer)
}

#[cfg(test)]
mod tests {
    use super::*;
    use hickory_proto::op::Query;
    use hickory_proto::rr::Name;

    fn query(name: &str, kind: RecordType) -> Vec<u8> {
        let mut message = Message::new();
        message
            .set_id(42)
            .set_message_type(MessageType::Query)
            .set_op_code(OpCode::Query)
            .set_recursion_desired(true)
            .add_query(Query::query(Name::from_ascii(name).unwrap(), kind));
        message.to_vec().unwrap()
    }

    fn decode(answer: Answer) -> Message {
        match answer {
            Answer::Reply(bytes) => Message::from_vec(&bytes).unwrap(),
            other => panic!("expected a reply, got {other:?}"),
        }
    }

    fn table() -> DnsTable {
        let mut table = DnsTable::new();
        table.add_pod("default", "web-0", "fd00::1".parse().unwrap());
        table.add_deployment_pod("default", "web", "fd00::2".parse().unwrap());
        table.add_deployment_pod("default", "web", "fd00::1".parse().unwrap());
        table.add_deployment("default", "empty");
        table
    }

    #[test]
    fn pod_names_answer_their_aaaa() {
        let reply = decode(answer(
            &query("web-0.default.pod.corral.", RecordType::AAAA),
            &table(),
        ));
        assert_eq!(reply.id(), 42);
        assert_eq!(reply.response_code(), ResponseCode::NoError);
        assert!(reply.authoritative());
        let addresses: Vec<RData> = reply.answers().iter().map(|r| r.data().clone()).collect();
        assert_eq!(
            addresses,
            vec![RData::AAAA(AAAA("fd00::1".parse().unwrap()))]
        );
    }

    #[test]
    fn deployments_answer_every_ready_pod_and_case_does_not_matter() {
        let reply = decode(answer(
            &query("WEB.default.PD.corral", RecordType::AAAA),
            &table(),
        ));
        assert_eq!(reply.answers().len(), 2);
        let empty = decode(answer(
            &query("empty.default.pd.corral.", RecordType::AAAA),
            &table(),
        ));
        assert_eq!(empty.response_code(), ResponseCode::NoError);
        assert!(empty.answers().is_empty());
    }

    #[test]
    fn unknown_names_in_the_zone_are_nxdomain_and_a_queries_are_empty() {
        let missing = decode(answer(
            &query("nope.default.pod.corral.", RecordType::AAAA),
            &table(),
        ));
        assert_eq!(missing.response_code(), ResponseCode::NXDomain);
        let v4 = decode(answer(
            &query("web-0.default.pod.corral.", RecordType::A),
            &table(),
        ));
        assert_eq!(v4.response_code(), ResponseCode::NoError);
        assert!(v4.answers().is_empty());
    }

    #[test]
    fn other_names_are_forwarded_and_garbage_dropped() {
        assert_eq!(
            answer(&query("example.org.", RecordType::AAAA), &table()),
            Answer::Forward
        );
        assert_eq!(
            answer(&query("notcorral.", RecordType::AAAA), &table()),
            Answer::Forward
        );
        assert_eq!(answer(b"\x00\x01", &table()), Answer::Drop);
    }

    #[test]
    fn resolv_conf_parsing_and_rendering() {
        let text = "# comment\nsearch lan\nnameserver 192.0.2.53\nnameserver ::1\n";
        assert_eq!(
            upstream_from_resolv_conf(text),
            Some("192.0.2.53:53".parse().unwrap())
        );
        assert_eq!(upstream_from_resolv_conf("search lan\n"), None);
        let conf = pod_resolv_conf("fd00::1".parse().unwrap(), "team-a");
        assert!(conf.starts_with("nameserver fd00::1\n"), "{conf}");
        assert!(
            conf.contains("search team-a.pod.corral team-a.pd.corral"),
            "{conf}"
        );
    }
}
