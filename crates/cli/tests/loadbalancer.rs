//! The default load balancer end to end on a 3-node `corral lab`: a
//! `kind: LoadBalancer` in front of two httpd pods on different nodes,
//! served by `corral lb-proxy` (the `l4-proxy` controller) in node-0.
//! An IPv4 client in node-1 reaches both pods through the proxy's IPv4
//! frontend; when one pod turns unready, `status.backends` drops it and
//! every request goes to the other. A second LB controller is refused by
//! field ownership, naming the first. Needs root, runc, nft and busybox;
//! fails without. (busybox 1.35's `wget -T` crashes: `timeout` bounds
//! each fetch.)

mod common;

use std::path::{Path, PathBuf};
use std::process::{Child, Stdio};
use std::time::Duration;

use common::lab::Lab;
use common::{CORRAL, wait_for};

/// A `corral lb-proxy` running in node-0; its log is printed when the test
/// fails, and the `lab exec` wrapping it is killed on drop (the proxy
/// itself ends with `lab down`).
struct ProxyGuard {
    child: Child,
    log: PathBuf,
}

impl ProxyGuard {
    fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }
}

impl Drop for ProxyGuard {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        if std::thread::panicking() {
            eprintln!("lb-proxy log:\n{}", self.log());
        }
    }
}

/// Starts `corral lb-proxy` in node-0 with a controller token for `name`,
/// given the server by flags or (`by_flags` false) by the lab's client
/// config, whose token `$CORRAL_CONTROLLER_TOKEN` replaces.
fn start_proxy(lab: &Lab, logs: &Path, name: &str, by_flags: bool) -> ProxyGuard {
    let token = lab.corral(&["token", "create", "--controller", name]);
    let log = logs.join(format!("{name}.log"));
    let out = std::fs::File::create(&log).expect("create the proxy log");
    let server = lab.state["server"].as_str().expect("lab.json server");
    let ca = lab.dir.join("server").join("tls").join("ca.pem");
    let (ipv4, ipv6) = (lab.node_field(0, "ipv4"), lab.node_field(0, "ipv6"));
    let ca = ca.to_string_lossy();
    let mut args = vec![CORRAL, "lb-proxy"];
    if by_flags {
        args.extend(["--server", server, "--ca", &ca]);
    }
    args.extend(["--listen-v4", &ipv4, "--listen-v6", &ipv6]);
    let mut command = lab.command("node-0", &args);
    command
        .env("CORRAL_CONTROLLER_TOKEN", token.trim())
        .env("CORRAL_LOG", "info,corral_controllers=debug")
        .stdin(Stdio::null())
        .stdout(out.try_clone().expect("clone the log file"))
        .stderr(out);
    ProxyGuard {
        child: command.spawn().expect("start corral lb-proxy"),
        log,
    }
}

/// An httpd pod on `node` answering `body`, ready while /tmp/ready exists.
fn pod(name: &str, node: &str, body: &str) -> String {
    format!(
        "kind: Pod
metadata: {{name: {name}, labels: {{app: lbweb}}}}
spec:
  placement: {{node: {node}}}
  containers:
    - name: web
      image: local/busybox:1
      command: [sh, -c, \"echo {body} > /tmp/index.html && touch /tmp/ready && exec httpd -f -p 8080 -h /tmp\"]
      ports: [8080]
      readiness: {{exec: {{command: [cat, /tmp/ready]}}, periodSeconds: 1}}
"
    )
}

const LOAD_BALANCER: &str = "kind: LoadBalancer
metadata: {name: front}
spec:
  selector: {app: lbweb}
  ports: [{name: http, port: 8000, targetPort: 8080}]
";

const SECOND_LB_CONTROLLER: &str = "kind: Controller
metadata: {name: lb-other}
spec:
  owns: [\"LoadBalancer:status.addresses\"]
";

/// The LoadBalancer's status once `check` holds for it.
fn lb_status(
    lab: &Lab,
    what: &str,
    check: impl Fn(&serde_json::Value) -> bool,
) -> serde_json::Value {
    wait_for(what, Duration::from_secs(60), || {
        let status = lab.json("lb/front")?["status"].clone();
        check(&status).then_some(status)
    })
}

fn strings(value: &serde_json::Value) -> Vec<String> {
    value
        .as_array()
        .map(|items| {
            items
                .iter()
                .filter_map(|i| i.as_str().map(str::to_string))
                .collect()
        })
        .unwrap_or_default()
}

/// One request from node-1 (an IPv4 client on the lab's network).
fn fetch(lab: &Lab, url: &str) -> Option<String> {
    let output = lab.exec(
        "node-1",
        &["busybox", "timeout", "5", "wget", "-q", "-O-", url],
    );
    output
        .status
        .success()
        .then(|| String::from_utf8_lossy(&output.stdout).trim().to_string())
}

#[test]
fn a_load_balancer_forwards_ipv4_to_ready_pods_and_follows_readiness() {
    corral_testkit::require_root();
    for tool in ["runc", "nft", "ip", "busybox"] {
        corral_testkit::require_tool(tool);
    }
    let scratch = tempfile::tempdir().expect("temp dir");
    let tar =
        corral_testkit::busybox_image_tar(scratch.path(), corral_testkit::ImageFormat::OciLayout);
    let lab = Lab::up("lb", 3, &tar, &[]);
    let proxy = start_proxy(&lab, scratch.path(), "lb-l4-proxy", true);

    // The proxy registers as the owner of LoadBalancer:status.
    let owner = wait_for("lb-l4-proxy to register", Duration::from_secs(30), || {
        lab.try_corral(&["explain", "loadbalancer.status.addresses"])
            .ok()
            .filter(|out| out.contains("owner:   controller lb-l4-proxy"))
    });
    assert!(owner.contains("LoadBalancer:status.addresses"), "{owner}");

    let manifest = scratch.path().join("lb.yaml");
    std::fs::write(
        &manifest,
        format!(
            "{}---\n{}---\n{LOAD_BALANCER}",
            pod("web-a", "node-1", "from-a"),
            pod("web-b", "node-2", "from-b")
        ),
    )
    .expect("write manifest");
    lab.corral(&["apply", "-f", &manifest.to_string_lossy()]);

    let ready = lb_status(&lab, "both pods behind lb/front", |status| {
        status["ready"] == 2
    });
    let (ipv4, ipv6) = (lab.node_field(0, "ipv4"), lab.node_field(0, "ipv6"));
    assert_eq!(strings(&ready["addresses"]), vec![ipv4.clone(), ipv6]);
    assert_eq!(ready["owner"], "lb-l4-proxy");
    let address_of = |name: &str| {
        lab.json(&format!("pod/{name}")).expect("the pod")["status"]["address"]
            .as_str()
            .expect("a pod address")
            .to_string()
    };
    let (address_a, address_b) = (address_of("web-a"), address_of("web-b"));
    let mut expected = vec![address_a.clone(), address_b.clone()];
    // Sorted as addresses (the controller's order), not as text.
    expected.sort_by_key(|a| a.parse::<std::net::Ipv6Addr>().expect("an IPv6 address"));
    assert_eq!(strings(&ready["backends"]), expected);
    let listed = lab.corral(&["get", "lb"]);
    assert!(
        listed.contains("ADDRESSES") && listed.contains(&format!("{ipv4},")),
        "{listed}"
    );
    assert!(listed.contains("8000→8080"), "{listed}");

    // An IPv4 client reaches both pods (round-robin) through the frontend.
    let url = format!("http://{ipv4}:8000/");
    let mut bodies = Vec::new();
    for _ in 0..6 {
        bodies.push(wait_for(
            "a response through the LB",
            Duration::from_secs(20),
            || fetch(&lab, &url),
        ));
    }
    assert!(
        bodies.iter().any(|b| b == "from-a") && bodies.iter().any(|b| b == "from-b"),
        "round-robin must reach both pods: {bodies:?}"
    );
    // The IPv6 frontend serves the same LoadBalancer.
    let url6 = format!("http://[{}]:8000/", lab.node_field(0, "ipv6"));
    let body6 = fetch(&lab, &url6).expect("a response through the IPv6 frontend");
    assert!(body6 == "from-a" || body6 == "from-b", "{body6}");

    // web-a turns unready: the backends follow, all traffic goes to web-b.
    lab.corral(&["exec", "pod/web-a", "--", "rm", "/tmp/ready"]);
    let one = lb_status(&lab, "web-a to leave lb/front", |status| {
        status["ready"] == 1
    });
    assert_eq!(strings(&one["backends"]), vec![address_b.clone()]);
    for _ in 0..6 {
        assert_eq!(
            fetch(&lab, &url).as_deref(),
            Some("from-b"),
            "only the ready pod may answer"
        );
    }

    // And comes back when ready again.
    lab.corral(&["exec", "pod/web-a", "--", "touch", "/tmp/ready"]);
    let both = lb_status(&lab, "web-a to rejoin lb/front", |status| {
        status["ready"] == 2
    });
    assert_eq!(strings(&both["backends"]), expected);

    // A second LB controller is refused by field ownership, naming the first:
    // registering by hand, and a second proxy starting with its own token.
    let second = scratch.path().join("second.yaml");
    std::fs::write(&second, SECOND_LB_CONTROLLER).expect("write manifest");
    let refused = lab
        .try_corral(&["apply", "-f", &second.to_string_lossy()])
        .expect_err("a second owner of LoadBalancer:status.addresses");
    assert!(
        refused.contains(
            "LoadBalancer:status.addresses is already owned by controller lb-l4-proxy; controller lb-other may not register it"
        ),
        "{refused}"
    );
    let mut rival = start_proxy(&lab, scratch.path(), "lb-rival", false);
    let exited = wait_for(
        "the rival proxy to give up",
        Duration::from_secs(30),
        || rival.child.try_wait().ok().flatten(),
    );
    assert!(!exited.success(), "the rival must fail");
    let log = rival.log();
    assert!(
        log.contains("cannot register controller lb-rival")
            && log.contains("already owned by controller lb-l4-proxy"),
        "{log}"
    );
    drop(proxy);
}
