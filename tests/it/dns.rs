//! A DNS server on loopback that a test controls: A and SRV records it
//! changes at will, and failures it turns on (SERVFAIL, silence). Real
//! DNS on the wire (UDP, and TCP for truncated answers), from
//! `hickory-server`.

use std::collections::HashMap;
use std::net::{Ipv4Addr, SocketAddr};
use std::str::FromStr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use hickory_server::authority::MessageResponseBuilder;
use hickory_server::proto::op::{Header, ResponseCode};
use hickory_server::proto::rr::rdata::{A, SRV};
use hickory_server::proto::rr::{Name, RData, Record, RecordType};
use hickory_server::proto::xfer::Protocol;
use hickory_server::server::{Request, RequestHandler, ResponseHandler, ResponseInfo};
use hickory_server::ServerFuture;

/// Records a UDP answer carries at most (1232 bytes of EDNS payload).
const MAX_UDP_RECORDS: usize = 40;

/// How the server answers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    Answer,
    ServFail,
    /// Answers nothing: the resolver times out.
    Silent,
}

#[derive(Debug, Default)]
struct Zone {
    a: HashMap<String, Vec<Ipv4Addr>>,
    srv: HashMap<String, Vec<(u16, u16, u16, String)>>,
    ttl: u32,
    mode: Option<Mode>,
    queries: u64,
}

#[derive(Clone)]
struct Handler(Arc<Mutex<Zone>>);

pub struct DnsServer {
    pub addr: SocketAddr,
    zone: Arc<Mutex<Zone>>,
    task: tokio::task::JoinHandle<()>,
}

fn key(name: &str) -> String {
    name.trim_end_matches('.').to_ascii_lowercase()
}

impl DnsServer {
    pub async fn start() -> DnsServer {
        let zone = Arc::new(Mutex::new(Zone {
            ttl: 1,
            ..Zone::default()
        }));
        let mut server = ServerFuture::new(Handler(Arc::clone(&zone)));
        // UDP and TCP on one port (a truncated answer is asked again over TCP).
        let (udp, tcp) = loop {
            let udp = tokio::net::UdpSocket::bind("127.0.0.1:0").await.unwrap();
            let port = udp.local_addr().unwrap().port();
            if let Ok(tcp) = tokio::net::TcpListener::bind(("127.0.0.1", port)).await {
                break (udp, tcp);
            }
        };
        let addr = udp.local_addr().unwrap();
        server.register_socket(udp);
        server.register_listener(tcp, Duration::from_secs(5));
        let task = tokio::spawn(async move {
            let _ = server.block_until_done().await;
        });
        DnsServer { addr, zone, task }
    }

    pub fn set_a(&self, name: &str, ips: &[Ipv4Addr]) {
        self.zone.lock().unwrap().a.insert(key(name), ips.to_vec());
    }

    /// `(priority, weight, port, target)` records for `name`.
    pub fn set_srv(&self, name: &str, records: &[(u16, u16, u16, &str)]) {
        let records = records
            .iter()
            .map(|(p, w, port, t)| (*p, *w, *port, key(t)))
            .collect();
        self.zone.lock().unwrap().srv.insert(key(name), records);
    }

    /// Forgets `name`: NXDOMAIN from now on.
    pub fn remove(&self, name: &str) {
        let mut zone = self.zone.lock().unwrap();
        zone.a.remove(&key(name));
        zone.srv.remove(&key(name));
    }

    pub fn set_ttl(&self, ttl: u32) {
        self.zone.lock().unwrap().ttl = ttl;
    }

    pub fn set_mode(&self, mode: Mode) {
        self.zone.lock().unwrap().mode = Some(mode);
    }

    pub fn queries(&self) -> u64 {
        self.zone.lock().unwrap().queries
    }
}

impl Drop for DnsServer {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// `RequestHandler` is an `async_trait`: its method, desugared.
impl RequestHandler for Handler {
    fn handle_request<'a, 'r, 'f, R>(
        &'a self,
        request: &'r Request,
        response: R,
    ) -> std::pin::Pin<Box<dyn std::future::Future<Output = ResponseInfo> + Send + 'f>>
    where
        R: ResponseHandler + 'f,
        'a: 'f,
        'r: 'f,
        Self: 'f,
    {
        Box::pin(self.answer(request, response))
    }
}

impl Handler {
    async fn answer<R: ResponseHandler>(&self, request: &Request, mut response: R) -> ResponseInfo {
        let mut header = Header::response_from_request(request.header());
        header.set_authoritative(true);
        let Ok(info) = request.request_info() else {
            return header.into();
        };
        let name = key(&info.query.name().to_string());
        let kind = info.query.query_type();
        let (mode, records, known) = {
            let mut zone = self.0.lock().unwrap();
            zone.queries += 1;
            let ttl = zone.ttl;
            let owner = Name::from_str(&format!("{name}.")).unwrap();
            let mut records = Vec::new();
            let known = zone.a.contains_key(&name) || zone.srv.contains_key(&name);
            match kind {
                RecordType::A => {
                    for ip in zone.a.get(&name).into_iter().flatten() {
                        records.push(Record::from_rdata(owner.clone(), ttl, RData::A(A(*ip))));
                    }
                }
                RecordType::SRV => {
                    for (priority, weight, port, target) in
                        zone.srv.get(&name).into_iter().flatten()
                    {
                        let target = Name::from_str(&format!("{target}.")).unwrap();
                        records.push(Record::from_rdata(
                            owner.clone(),
                            ttl,
                            RData::SRV(SRV::new(*priority, *weight, *port, target)),
                        ));
                    }
                }
                _ => {}
            }
            (zone.mode.unwrap_or(Mode::Answer), records, known)
        };
        let builder = MessageResponseBuilder::from_message_request(request);
        let sent = match mode {
            Mode::Silent => return header.into(),
            Mode::ServFail => {
                response
                    .send_response(builder.error_msg(request.header(), ResponseCode::ServFail))
                    .await
            }
            Mode::Answer if !known => {
                header.set_response_code(ResponseCode::NXDomain);
                response
                    .send_response(builder.build_no_records(header))
                    .await
            }
            // Over UDP, an answer larger than a datagram holds comes back
            // truncated and empty (TC), as BIND does: asked again over TCP.
            Mode::Answer
                if request.protocol() == Protocol::Udp && records.len() > MAX_UDP_RECORDS =>
            {
                header.set_truncated(true);
                response
                    .send_response(builder.build_no_records(header))
                    .await
            }
            Mode::Answer => {
                response
                    .send_response(builder.build(header, records.iter(), &[], &[], &[]))
                    .await
            }
        };
        sent.unwrap_or_else(|_| header.into())
    }
}
