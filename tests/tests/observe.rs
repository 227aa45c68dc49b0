//! What a running node shows: Prometheus metrics over HTTP (`run --http`).

use nightshift_tests::*;
use std::io::{Read, Write};
use std::time::Duration;

/// GET `path` from `addr` (HTTP/1.1, one request per connection): the status line and the body.
fn get(addr: &str, path: &str) -> Option<(String, String)> {
    let mut s = std::net::TcpStream::connect(addr).ok()?;
    s.set_read_timeout(Some(Duration::from_secs(10))).ok()?;
    write!(
        s,
        "GET {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n"
    )
    .ok()?;
    let mut text = String::new();
    s.read_to_string(&mut text).ok()?;
    let (head, body) = text.split_once("\r\n\r\n")?;
    Some((head.lines().next()?.to_string(), body.to_string()))
}

/// The value of an unlabelled sample `name` in Prometheus text.
fn sample(text: &str, name: &str) -> Option<f64> {
    text.lines()
        .find_map(|l| l.strip_prefix(name)?.strip_prefix(' ')?.parse().ok())
}

#[test]
fn a_node_serves_prometheus_metrics_that_follow_its_rounds_and_its_connections() {
    let dir = tempfile::tempdir().unwrap();
    let swarm = TestSwarm::create(
        dir.path(),
        2,
        &["--inner-steps", "15", "--warmup-steps", "5"],
    );
    let (_boot, addr) = swarm.bootstrap();
    // More rounds than the test needs: the nodes still run when the doctor asks them.
    let _n0 = swarm.node_with(
        0,
        &addr,
        1000,
        &["--idle", "always", "--http", "127.0.0.1:0"],
    );
    let _n1 = swarm.node(1, &addr, 1000);
    let file = dir.path().join("node0").join("http.addr");
    assert!(
        wait_until(Duration::from_secs(120), || file.exists()),
        "node 0 never wrote http.addr"
    );
    let http = std::fs::read_to_string(&file).unwrap().trim().to_string();
    let completed = |min: f64| {
        let mut last = None;
        let ok = wait_until(Duration::from_secs(120), || {
            last = get(&http, "/metrics");
            last.as_ref()
                .and_then(|(_, b)| sample(b, "nightshift_rounds_completed_total"))
                .is_some_and(|n| n >= min)
        });
        assert!(ok, "rounds completed never reached {min}: {last:?}");
        last.unwrap()
    };
    let (status, first) = completed(1.0);
    assert!(status.contains("200"), "{status}");
    let (_, later) = completed(3.0);
    let round = |t: &str| sample(t, "nightshift_round").unwrap();
    assert!(round(&later) > round(&first), "{first}\n---\n{later}");
    let loss = sample(&later, "nightshift_val_loss").unwrap();
    assert!(loss.is_finite() && loss > 0.0, "val loss {loss}");
    assert!(sample(&later, "nightshift_round_bytes_sent_total").unwrap() > 0.0);
    assert_eq!(sample(&later, "nightshift_round_contributors"), Some(2.0));
    // libp2p's own: the connections this node made to the bootstrap and its peer.
    let established = later
        .lines()
        .filter(|l| l.starts_with("libp2p_swarm_connections_established_total"))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum::<f64>();
    assert!(established >= 2.0, "{later}");
    assert!(later.contains("libp2p_kad_"), "no Kademlia metrics");
    // Anything else is not found.
    let (status, _) = get(&http, "/nothing").unwrap();
    assert!(status.contains("404"), "{status}");
    // The doctor asks the running node: its round, its reachability, the peers' clocks. The
    // node knows it is reachable once a peer has dialled it back (AutoNAT's first probe, 2 s
    // after the start, can come before the peers know its addresses; the next is 30 s later).
    let data_dir = dir.path().join("node0").display().to_string();
    let said = |doc: &serde_json::Value, section: &str, level: &str, what: &str| {
        checks(doc).iter().any(|c| {
            c["section"] == section
                && c["level"] == level
                && c["what"].as_str().unwrap().contains(what)
        })
    };
    let mut doc = serde_json::Value::Null;
    wait_until(Duration::from_secs(90), || {
        doc = doctor(&["--data-dir", &data_dir]);
        said(&doc, "network", "ok", "reachable")
    });
    assert!(said(&doc, "data", "ok", "a node runs in"), "{doc:#}");
    assert!(said(&doc, "network", "ok", "reachable"), "{doc:#}");
    assert!(said(&doc, "clock", "ok", "peers' clocks are"), "{doc:#}");
}

/// `nightshift doctor --json ARGS`, which must succeed.
fn doctor(args: &[&str]) -> serde_json::Value {
    let out = std::process::Command::new(nightshift_bin())
        .arg("doctor")
        .arg("--json")
        .args(args)
        .output()
        .expect("run nightshift doctor");
    assert!(
        out.status.success(),
        "doctor failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).expect("doctor prints JSON")
}

fn checks(doc: &serde_json::Value) -> Vec<serde_json::Value> {
    doc["checks"].as_array().cloned().unwrap_or_default()
}

#[test]
fn the_doctor_says_plainly_what_this_machine_lacks_and_what_to_do() {
    let dir = tempfile::tempdir().unwrap();
    // A port another program holds, and a data directory that does not exist yet.
    let held = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = held.local_addr().unwrap().port();
    let (fresh, listen) = (
        dir.path().join("fresh").display().to_string(),
        format!("/ip4/127.0.0.1/tcp/{port}"),
    );
    let ask = || {
        doctor(&[
            "--data-dir",
            &fresh,
            "--listen",
            &listen,
            "--idle",
            "always",
        ])
    };
    let doc = ask();
    let find = |section: &str| -> Vec<serde_json::Value> {
        checks(&doc)
            .into_iter()
            .filter(|c| c["section"] == section)
            .collect()
    };
    let device: Vec<String> = find("device")
        .iter()
        .map(|c| c["what"].as_str().unwrap().to_string())
        .collect();
    if !std::path::Path::new("/dev/nvidia0").exists() {
        // This machine has no GPU: said as such, and the node trains on the CPU.
        assert!(
            device.iter().any(|d| d.contains("no NVIDIA GPU")),
            "{device:?}"
        );
        assert!(
            device.iter().any(|d| d.contains("trains on the CPU")),
            "{device:?}"
        );
    }
    let port_check = &find("port")[0];
    assert_eq!(port_check["level"], "fail", "{doc:#}");
    assert!(
        port_check["todo"].as_str().unwrap().contains("--listen"),
        "{doc:#}"
    );
    assert_eq!(find("idle")[0]["level"], "ok", "{doc:#}");
    assert!(
        find("data")[0]["todo"]
            .as_str()
            .unwrap()
            .contains("creates it"),
        "{doc:#}"
    );
    assert_eq!(doc["worst"], "fail");
    drop(held);
    // Once the port is free again, nothing keeps the node from training.
    let doc = ask();
    assert_ne!(doc["worst"], "fail", "{doc:#}");
}

/// What the dashboard page, open in a headless Chromium, reported on its console so far.
struct Browser {
    child: std::process::Child,
    lines: std::sync::Arc<std::sync::Mutex<Vec<String>>>,
}

impl Browser {
    fn open(url: &str) -> Browser {
        let mut child = std::process::Command::new("chromium")
            .args([
                "--headless",
                "--no-sandbox",
                "--disable-gpu",
                "--disable-dev-shm-usage",
                "--enable-logging=stderr",
                "--v=0",
                url,
            ])
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .expect("chromium (Debian's `chromium` package) runs");
        let lines = std::sync::Arc::new(std::sync::Mutex::new(vec![]));
        let err = child.stderr.take().unwrap();
        let keep = lines.clone();
        std::thread::spawn(move || {
            use std::io::BufRead;
            for l in std::io::BufReader::new(err).lines().map_while(Result::ok) {
                if let Some((_, msg)) = l.split_once("nightshift dashboard: ") {
                    keep.lock().unwrap().push(msg.to_string());
                }
            }
        });
        Browser { child, lines }
    }

    /// The rounds the page said it added to its table, in order.
    fn rounds(&self) -> Vec<(u64, usize)> {
        self.lines
            .lock()
            .unwrap()
            .iter()
            .filter_map(|l| {
                let rest = l.strip_prefix("round ")?;
                let (round, rest) = rest.split_once(" shown; ")?;
                let rows = rest.split_once(" rounds in the table")?.0;
                Some((round.parse().ok()?, rows.parse().ok()?))
            })
            .collect()
    }

    fn said(&self, what: &str) -> bool {
        self.lines.lock().unwrap().iter().any(|l| l.contains(what))
    }
}

impl Drop for Browser {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

#[test]
fn the_dashboard_shows_new_rounds_as_they_complete_in_a_real_browser() {
    let dir = tempfile::tempdir().unwrap();
    let swarm = TestSwarm::create(
        dir.path(),
        2,
        &["--inner-steps", "15", "--warmup-steps", "5"],
    );
    let (_boot, addr) = swarm.bootstrap();
    let mut n0 = swarm.node_with(0, &addr, 40, &["--idle", "always", "--http", "127.0.0.1:0"]);
    let mut n1 = swarm.node(1, &addr, 40);
    let file = dir.path().join("node0").join("http.addr");
    assert!(
        wait_until(Duration::from_secs(120), || swarm.round_of(0) >= 2),
        "the swarm did not start"
    );
    let url = format!("http://{}/", std::fs::read_to_string(&file).unwrap().trim());
    let at_open = swarm.round_of(0);
    let page = Browser::open(&url);
    // Rounds completed after the page opened appear in it, one more row each.
    let live = wait_until(Duration::from_secs(120), || {
        page.rounds().iter().any(|(r, _)| *r >= at_open + 3)
    });
    let shown = page.rounds();
    assert!(live, "opened at round {at_open}, the page showed {shown:?}");
    let (first, last) = (shown[0], shown[shown.len() - 1]);
    assert!(last.1 > first.1, "the table did not grow: {shown:?}");
    // The peers table lists the other trainer.
    let peer = short_key_of(&dir.path().join("node1.key.json"));
    assert!(
        wait_until(Duration::from_secs(30), || page.said(&peer)),
        "peer {peer} never listed"
    );
    drop(page);
    n0.kill9();
    n1.kill9();
}
/// First 6 bytes (hex) of the public key in a key file.
fn short_key_of(path: &std::path::Path) -> String {
    let v: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
    v["public"].as_str().unwrap()[..12].to_string()
}
