//! The proxy against real sockets: its cap on connections, its requests, its credentials' endpoints.

use super::*;
use tokio::io::AsyncReadExt;

#[tokio::test]
async fn an_agent_s_connections_beyond_the_cap_wait_until_one_ends() {
    // The host the agent may reach: it counts connections and holds each open until its
    // client ends.
    let upstream = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = upstream.local_addr().unwrap().port();
    let reached = Arc::new(AtomicU64::new(0));
    let counted = reached.clone();
    tokio::spawn(async move {
        while let Ok((mut stream, _)) = upstream.accept().await {
            counted.fetch_add(1, Ordering::SeqCst);
            tokio::spawn(async move {
                let mut ignored = Vec::new();
                let _ = stream.read_to_end(&mut ignored).await;
            });
        }
    });
    let (_proxy, proxy_address) = proxy_to(&[port], Vec::new(), None);
    let connect = format!("CONNECT 127.0.0.1:{port} HTTP/1.1\r\nHost: x\r\n\r\n");
    let mut agents = Vec::new();
    for _ in 0..MAX_CONNECTIONS + 20 {
        let mut agent = TcpStream::connect(proxy_address).await.unwrap();
        agent.write_all(connect.as_bytes()).await.unwrap();
        agents.push(agent);
    }
    let settled = |want: u64| {
        let reached = reached.clone();
        async move {
            for _ in 0..500 {
                if reached.load(Ordering::SeqCst) >= want {
                    break;
                }
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
            // Anything more would have come by now.
            tokio::time::sleep(Duration::from_millis(200)).await;
            reached.load(Ordering::SeqCst)
        }
    };
    assert_eq!(
        settled(MAX_CONNECTIONS as u64).await,
        MAX_CONNECTIONS as u64
    );
    // Ten end: ten of the waiting ones are served.
    agents.drain(..10);
    assert_eq!(
        settled(MAX_CONNECTIONS as u64 + 10).await,
        MAX_CONNECTIONS as u64 + 10
    );
}

#[test]
fn a_plain_request_goes_on_in_origin_form() {
    let head = b"GET http://example.com:8080/a?b=1 HTTP/1.1\r\nHost: example.com:8080\r\nProxy-Connection: keep-alive\r\nAccept: */*\r\n\r\n";
    let request = parse(head).unwrap();
    assert_eq!((request.host.as_str(), request.port), ("example.com", 8080));
    let Kind::Forward(sent) = request.kind else {
        panic!("not sent on")
    };
    assert_eq!(
        String::from_utf8(sent).unwrap(),
        "GET /a?b=1 HTTP/1.1\r\nHost: example.com:8080\r\nAccept: */*\r\n\r\n"
    );
    let connect = parse(b"CONNECT [::1]:443 HTTP/1.1\r\nHost: [::1]:443\r\n\r\n").unwrap();
    assert_eq!((connect.host.as_str(), connect.port), ("::1", 443));
    assert!(matches!(connect.kind, Kind::Connect));
    assert_eq!(parse(b"GET http://h HTTP/1.1\r\n\r\n").unwrap().port, 80);
    // The proxy's own address, in origin form or through itself: an endpoint.
    for head in [
        &b"GET /model/v1 HTTP/1.1\r\nHost: 127.0.0.1:3128\r\n\r\n"[..],
        b"GET http://127.0.0.1:3128/model/v1 HTTP/1.1\r\nConnection: keep-alive\r\n\r\n",
    ] {
        let Kind::Endpoint(head) = parse(head).unwrap().kind else {
            panic!("not an endpoint")
        };
        assert_eq!(head.path, "/model/v1");
        assert_eq!(
            String::from_utf8(head.bytes("api.example.com")).unwrap(),
            "GET /model/v1 HTTP/1.1\r\nHost: api.example.com\r\nConnection: close\r\n\r\n"
        );
    }
    // Without credentials, the proxy says what it takes.
    let Kind::Endpoint(local) = parse(b"GET /local HTTP/1.1\r\n\r\n").unwrap().kind else {
        panic!("not an endpoint")
    };
    let (status, said) = endpoint(&[], &local).err().unwrap();
    assert_eq!(status, 400);
    assert!(said.contains("absolute http:// URL"), "{said}");
    for (head, said) in [
        (&b"GET https://h/ HTTP/1.1\r\n\r\n"[..], "CONNECT"),
        (b"CONNECT h HTTP/1.1\r\n\r\n", "host:port"),
        (b"\x16\x03\x01 garbage\r\n\r\n", "could not read"),
    ] {
        let error = parse(head).err().unwrap();
        assert!(error.contains(said), "{error}");
    }
}

/// A host that answers every request `ok` and keeps each head it read.
async fn recording_host() -> (u16, Arc<std::sync::Mutex<Vec<String>>>) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    let heads = Arc::new(std::sync::Mutex::new(Vec::new()));
    let kept = heads.clone();
    tokio::spawn(async move {
        while let Ok((mut stream, _)) = listener.accept().await {
            let kept = kept.clone();
            tokio::spawn(async move {
                let mut buffer = Vec::new();
                if let Ok(end) = read_head(&mut stream, &mut buffer).await {
                    kept.lock()
                        .unwrap()
                        .push(String::from_utf8_lossy(&buffer[..end]).into_owned());
                    let _ = stream
                        .write_all(
                            b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nConnection: close\r\n\r\nok",
                        )
                        .await;
                }
            });
        }
    });
    (port, heads)
}

/// Sends `request` through the proxy at `proxy`; what came back.
async fn through(proxy: SocketAddr, request: &str) -> String {
    let mut agent = TcpStream::connect(proxy).await.unwrap();
    agent.write_all(request.as_bytes()).await.unwrap();
    let mut answer = Vec::new();
    agent.read_to_end(&mut answer).await.unwrap();
    String::from_utf8_lossy(&answer).into_owned()
}

fn held(upstream: &str, stand_in: &str, value: &str) -> HeldCredential {
    let value = value.to_owned();
    HeldCredential {
        name: "model".to_owned(),
        upstream: crew_core::config::credentials::parse_upstream(upstream).unwrap(),
        keys: vec![HeldKey {
            variable: "MODEL_API_KEY".to_owned(),
            stand_in: stand_in.to_owned(),
            value: Arc::new(move || Ok(value.clone())),
        }],
    }
}

#[tokio::test]
async fn a_credential_s_endpoint_adds_the_real_value_for_its_upstream_only() {
    let (model, at_model) = recording_host().await;
    let (other, at_other) = recording_host().await;
    let reported = Arc::new(std::sync::Mutex::new(Vec::new()));
    let log = {
        let reported = reported.clone();
        NetworkLog::new(move |request| reported.lock().unwrap().push(request))
    };
    let (_proxy, proxy) = proxy_to(
        &[model, other],
        vec![held(
            &format!("http://127.0.0.1:{model}/gateway"),
            "crew-stand-in-model-1",
            "sk-real",
        )],
        Some(log),
    );
    // Through the proxy to its own address, as a program with HTTP_PROXY set sends it.
    let answer = through(
        proxy,
        "POST http://127.0.0.1:3128/model/v1/messages?beta=1 HTTP/1.1\r\nHost: 127.0.0.1:3128\r\nx-api-key: crew-stand-in-model-1\r\nConnection: keep-alive\r\nContent-Length: 2\r\n\r\n{}",
    )
    .await;
    assert!(answer.ends_with("\r\n\r\nok"), "{answer}");
    let head = at_model.lock().unwrap().remove(0);
    assert!(
        head.starts_with(&format!(
            "POST /gateway/v1/messages?beta=1 HTTP/1.1\r\nHost: 127.0.0.1:{model}\r\n"
        )),
        "{head}"
    );
    assert!(head.contains("x-api-key: sk-real\r\n"), "{head}");
    assert!(head.contains("Connection: close\r\n"), "{head}");
    assert!(
        !head.contains("stand-in") && !head.contains("keep-alive"),
        "{head}"
    );
    // The stand-in sent to another host, even a listed one, is refused and reported.
    let refused = through(
        proxy,
        &format!("GET http://127.0.0.1:{other}/?k=crew-stand-in-model-1 HTTP/1.1\r\n\r\n"),
    )
    .await;
    assert!(refused.starts_with("HTTP/1.1 403"), "{refused}");
    assert!(refused.contains("MODEL_API_KEY"), "{refused}");
    assert!(at_other.lock().unwrap().is_empty());
    // An endpoint it does not have.
    let unknown = through(proxy, "GET /nothing/v1 HTTP/1.1\r\n\r\n").await;
    assert!(
        unknown.starts_with("HTTP/1.1 404") && unknown.contains("/model"),
        "{unknown}"
    );
    let reported = reported.lock().unwrap();
    assert!(
        reported.iter().any(|request| !request.allowed
            && request
                .reason
                .as_deref()
                .is_some_and(|reason| reason.contains("stand-in"))),
        "{reported:?}"
    );
}

#[tokio::test]
async fn an_https_upstream_is_reached_over_tls_with_the_system_s_roots() {
    let Some(dir) = tls_server_files() else {
        eprintln!("skipped: openssl cannot make a test certificate here");
        return;
    };
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let mut server = std::process::Command::new("openssl")
        .args(["s_server", "-quiet", "-www", "-accept"])
        .arg(format!("127.0.0.1:{port}"))
        .arg("-cert")
        .arg(dir.path().join("leaf.pem"))
        .arg("-key")
        .arg(dir.path().join("leaf.key"))
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    // The test's CA is a root (the system's are not read in this test binary).
    use rustls::pki_types::pem::PemObject as _;
    let ca = rustls::pki_types::CertificateDer::from_pem_file(dir.path().join("ca.pem")).unwrap();
    credentials::TEST_ROOTS.set(vec![ca]).unwrap();
    for _ in 0..100 {
        if std::net::TcpStream::connect(("127.0.0.1", port)).is_ok() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let (_proxy, proxy) = proxy_to(
        &[port],
        vec![held(&format!("https://127.0.0.1:{port}"), "s", "v")],
        None,
    );
    let answer = through(proxy, "GET /model/ HTTP/1.1\r\nx-api-key: s\r\n\r\n").await;
    let _ = server.kill();
    let _ = server.wait();
    // openssl's status page, which names the cipher the connection used.
    assert!(answer.starts_with("HTTP/1.0 200"), "{answer}");
    assert!(answer.contains("Cipher"), "{answer}");
}

/// A CA and a certificate for 127.0.0.1 it signed, made by openssl; `None` without it.
fn tls_server_files() -> Option<tempfile::TempDir> {
    let dir = tempfile::tempdir().ok()?;
    let script = "set -e
openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes -days 1 -subj /CN=crew-test-ca -keyout ca.key -out ca.pem
openssl req -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes -subj /CN=127.0.0.1 -keyout leaf.key -out leaf.csr
printf 'subjectAltName=IP:127.0.0.1\\nbasicConstraints=CA:FALSE\\n' > leaf.ext
openssl x509 -req -in leaf.csr -CA ca.pem -CAkey ca.key -CAcreateserial -days 1 -extfile leaf.ext -out leaf.pem";
    let made = std::process::Command::new("sh")
        .args(["-c", script])
        .current_dir(dir.path())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .status()
        .ok()?;
    made.success().then_some(dir)
}

/// A proxy that lets the agent reach `ports` of 127.0.0.1, holding `credentials`; its address.
fn proxy_to(
    ports: &[u16],
    credentials: Vec<HeldCredential>,
    log: Option<NetworkLog>,
) -> (Proxy, SocketAddr) {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let address = listener.local_addr().unwrap();
    let lists = vec![HostList {
        file: "the test".into(),
        hosts: ports
            .iter()
            .map(|port| {
                crew_core::config::HostPattern::parse(&format!("127.0.0.1:{port}")).unwrap()
            })
            .collect(),
    }];
    let proxy = Proxy::start(
        listener,
        Rules {
            lists,
            log,
            credentials,
        },
    )
    .unwrap();
    (proxy, address)
}

#[tokio::test]
async fn after_a_provider_refuses_one_agent_another_s_request_waits_the_time_it_asked() {
    // The provider refuses its first request (429, one second), answers the rest; each
    // request's arrival is kept.
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    let arrivals = Arc::new(std::sync::Mutex::new(Vec::new()));
    let kept = arrivals.clone();
    tokio::spawn(async move {
        while let Ok((mut stream, _)) = listener.accept().await {
            let kept = kept.clone();
            tokio::spawn(async move {
                let mut buffer = Vec::new();
                if read_head(&mut stream, &mut buffer).await.is_ok() {
                    let first = {
                        let mut kept = kept.lock().unwrap();
                        kept.push(tokio::time::Instant::now());
                        kept.len() == 1
                    };
                    let answer: &[u8] = match first {
                        true => b"HTTP/1.1 429 Too Many Requests\r\nretry-after: 1\r\nContent-Length: 2\r\nConnection: close\r\n\r\nno",
                        false => b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nConnection: close\r\n\r\nok",
                    };
                    // The test's client may be gone; its request is counted either way.
                    let _ = stream.write_all(answer).await;
                }
            });
        }
    });
    // Two agents, each with a proxy of its own, holding the same provider's key.
    let upstream = format!("http://127.0.0.1:{port}/v1");
    let (_first, first) = proxy_to(
        &[port],
        vec![held(&upstream, "crew-stand-in-a", "sk")],
        None,
    );
    let (_second, second) = proxy_to(
        &[port],
        vec![held(&upstream, "crew-stand-in-b", "sk")],
        None,
    );
    let request = |stand_in: &str| {
        format!(
            "POST /model/messages HTTP/1.1\r\nHost: 127.0.0.1:3128\r\nx-api-key: {stand_in}\r\nContent-Length: 2\r\n\r\n{{}}"
        )
    };
    let refused = through(first, &request("crew-stand-in-a")).await;
    assert!(refused.starts_with("HTTP/1.1 429"), "{refused}");
    let answered = through(second, &request("crew-stand-in-b")).await;
    assert!(answered.ends_with("ok"), "{answered}");
    let arrivals = arrivals.lock().unwrap();
    let waited = arrivals[1] - arrivals[0];
    assert!(
        waited >= std::time::Duration::from_millis(900),
        "the second agent's request reached the provider {waited:?} after its refusal"
    );
}
