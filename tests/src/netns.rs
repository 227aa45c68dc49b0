//! Home networks in Linux network namespaces, for the NAT tests: a "WAN" (a bridge), a public
//! host on it (the bootstrap node's), and home LANs, each behind its own router that
//! masquerades (NAT) and lets in only replies to what went out, as a home router does.
//!
//! ```text
//!   pub 10.9.0.2 ──┐
//!                  br0 (WAN, 10.9.0.0/24)
//!   router 1 10.9.0.11 ─ LAN 192.168.1.0/24 ─ host 1 192.168.1.2
//!   router 2 10.9.0.12 ─ LAN 192.168.2.0/24 ─ host 2 192.168.2.2
//! ```
//!
//! Needs root, `ip` (iproute2) and `iptables` (`.ci/run` installs them); every namespace is
//! deleted when the [`NatLab`] is dropped.

use std::process::Command;

/// How a home router maps its LAN's connections onto its WAN address.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Nat {
    /// Keeps a connection's source port when it is free (Linux's MASQUERADE; most home routers
    /// behave alike): the address a peer sees is the one the next peer sees, and hole punching
    /// works.
    PortPreserving,
    /// A fresh random port for every connection (symmetric NAT; carrier-grade NATs and some
    /// corporate firewalls): what one peer sees says nothing to another, and hole punching
    /// fails.
    Symmetric,
}

/// The namespaces of one test; names start with a prefix of the test's own.
pub struct NatLab {
    prefix: String,
    names: Vec<String>,
}

/// The public host's address on the WAN (the bootstrap node listens there).
pub const PUBLIC_IP: &str = "10.9.0.2";

fn sh(args: &[&str]) -> Result<(), String> {
    let out = Command::new(args[0])
        .args(&args[1..])
        .output()
        .map_err(|e| format!("cannot run {}: {e}", args[0]))?;
    if out.status.success() {
        Ok(())
    } else {
        Err(format!(
            "`{}` failed: {}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr).trim()
        ))
    }
}

impl NatLab {
    /// Builds the WAN, the public host and `homes` home LANs (each with one host), every router
    /// doing `nat`. Errors say what is missing (root, `ip`, `iptables`).
    pub fn new(prefix: &str, homes: usize, nat: Nat) -> Result<NatLab, String> {
        assert!((1..=9).contains(&homes));
        let mut lab = NatLab {
            prefix: prefix.into(),
            names: vec![],
        };
        lab.build(homes, nat).map_err(|e| {
            format!(
                "{e}\nthe NAT tests build networks in namespaces: they need root, `ip` (iproute2) \
                 and `iptables` (apt-get install iproute2 iptables)"
            )
        })?;
        Ok(lab)
    }

    /// The namespace's full name: `wan`, `pub`, `router1`, `host1`, ...
    pub fn ns(&self, name: &str) -> String {
        format!("{}-{name}", self.prefix)
    }

    /// Host `i`'s (1-based) LAN address.
    pub fn host_ip(i: usize) -> String {
        format!("192.168.{i}.2")
    }

    fn add_ns(&mut self, name: &str) -> Result<String, String> {
        let ns = self.ns(name);
        let _ = sh(&["ip", "netns", "del", &ns]);
        sh(&["ip", "netns", "add", &ns])?;
        self.names.push(ns.clone());
        sh(&["ip", "-n", &ns, "link", "set", "lo", "up"])?;
        Ok(ns)
    }

    /// A veth pair between two namespaces, both ends up.
    fn link(a: &str, a_if: &str, b: &str, b_if: &str) -> Result<(), String> {
        sh(&[
            "ip", "link", "add", a_if, "netns", a, "type", "veth", "peer", "name", b_if, "netns", b,
        ])?;
        sh(&["ip", "-n", a, "link", "set", a_if, "up"])?;
        sh(&["ip", "-n", b, "link", "set", b_if, "up"])
    }

    fn build(&mut self, homes: usize, nat: Nat) -> Result<(), String> {
        let wan = self.add_ns("wan")?;
        sh(&["ip", "-n", &wan, "link", "add", "br0", "type", "bridge"])?;
        sh(&["ip", "-n", &wan, "link", "set", "br0", "up"])?;
        let public = self.add_ns("pub")?;
        Self::link(&public, "wan0", &wan, "p0")?;
        sh(&["ip", "-n", &wan, "link", "set", "p0", "master", "br0"])?;
        sh(&[
            "ip",
            "-n",
            &public,
            "addr",
            "add",
            &format!("{PUBLIC_IP}/24"),
            "dev",
            "wan0",
        ])?;
        for i in 1..=homes {
            let router = self.add_ns(&format!("router{i}"))?;
            let host = self.add_ns(&format!("host{i}"))?;
            let port = format!("r{i}");
            Self::link(&router, "wan0", &wan, &port)?;
            sh(&["ip", "-n", &wan, "link", "set", &port, "master", "br0"])?;
            Self::link(&router, "lan0", &host, "eth0")?;
            let wan_ip = format!("10.9.0.{}/24", 10 + i);
            sh(&["ip", "-n", &router, "addr", "add", &wan_ip, "dev", "wan0"])?;
            let gw = format!("192.168.{i}.1");
            sh(&[
                "ip",
                "-n",
                &router,
                "addr",
                "add",
                &format!("{gw}/24"),
                "dev",
                "lan0",
            ])?;
            let host_ip = format!("{}/24", Self::host_ip(i));
            sh(&["ip", "-n", &host, "addr", "add", &host_ip, "dev", "eth0"])?;
            sh(&["ip", "-n", &host, "route", "add", "default", "via", &gw])?;
            sh(&[
                "ip",
                "netns",
                "exec",
                &router,
                "sysctl",
                "-qw",
                "net.ipv4.ip_forward=1",
            ])?;
            let ipt = |rule: &[&str]| {
                let mut args = vec!["ip", "netns", "exec", &router, "iptables"];
                args.extend_from_slice(rule);
                sh(&args)
            };
            let mut masq = vec![
                "-t",
                "nat",
                "-A",
                "POSTROUTING",
                "-o",
                "wan0",
                "-j",
                "MASQUERADE",
            ];
            if nat == Nat::Symmetric {
                masq.push("--random-fully");
            }
            ipt(&masq)?;
            // Unsolicited packets from the WAN are dropped, to the router itself too (no reset
            // sent back), as home routers do.
            ipt(&[
                "-A",
                "INPUT",
                "-i",
                "wan0",
                "-m",
                "conntrack",
                "--ctstate",
                "RELATED,ESTABLISHED",
                "-j",
                "ACCEPT",
            ])?;
            ipt(&["-A", "INPUT", "-i", "wan0", "-j", "DROP"])?;
            ipt(&["-P", "FORWARD", "DROP"])?;
            ipt(&["-A", "FORWARD", "-i", "lan0", "-o", "wan0", "-j", "ACCEPT"])?;
            ipt(&[
                "-A",
                "FORWARD",
                "-i",
                "wan0",
                "-o",
                "lan0",
                "-m",
                "conntrack",
                "--ctstate",
                "RELATED,ESTABLISHED",
                "-j",
                "ACCEPT",
            ])?;
        }
        Ok(())
    }

    /// Bytes that crossed the public host's WAN interface so far (received, sent).
    pub fn public_bytes(&self) -> (u64, u64) {
        let read = |what: &str| -> u64 {
            let out = Command::new("ip")
                .args([
                    "netns",
                    "exec",
                    &self.ns("pub"),
                    "cat",
                    &format!("/sys/class/net/wan0/statistics/{what}_bytes"),
                ])
                .output();
            out.ok()
                .and_then(|o| String::from_utf8_lossy(&o.stdout).trim().parse().ok())
                .unwrap_or(0)
        };
        (read("rx"), read("tx"))
    }
}

impl Drop for NatLab {
    fn drop(&mut self) {
        for ns in self.names.iter().rev() {
            let _ = sh(&["ip", "netns", "del", ns]);
        }
    }
}
