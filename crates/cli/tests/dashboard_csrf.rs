//! The dashboard's session rules over plain HTTP against `corral up`: the
//! sign-in cookie's attributes, the strict Content-Security-Policy, and
//! that a write made with the cookie is refused without the session's CSRF
//! token (or with a wrong one, or from another origin) and goes through,
//! as the signed-in person, with it; and that the dashboard is for
//! people only.

#![allow(clippy::unwrap_used)]

mod common;

use std::time::Duration;

use common::Cluster;
use serde_json::json;

/// A cookie-authenticated client with the cluster's CA.
fn http(cluster: &Cluster) -> reqwest::blocking::Client {
    let config = cluster.client_config();
    let ca = config["ca"]
        .as_str()
        .unwrap_or_else(|| panic!("no CA in the config: {config}"));
    reqwest::blocking::Client::builder()
        .add_root_certificate(reqwest::Certificate::from_pem(ca.as_bytes()).unwrap())
        .redirect(reqwest::redirect::Policy::none())
        .timeout(Duration::from_secs(20))
        .build()
        .unwrap()
}

#[test]
fn cookie_writes_need_the_csrf_token_and_pages_carry_a_strict_policy() {
    let cluster = Cluster::start();
    let config = cluster.client_config();
    let server = config["server"].as_str().unwrap().to_string();
    let token = config["token"].as_str().unwrap().to_string();
    let client = http(&cluster);
    cluster.ok(&[
        "apply",
        "-f",
        &cluster.manifest(
            "a.yaml",
            "kind: Config\nmetadata: {name: site}\nspec: {data: {a: '1'}}\n",
        ),
    ]);
    cluster.ok(&[
        "apply",
        "-f",
        &cluster.manifest(
            "b.yaml",
            "kind: Config\nmetadata: {name: site}\nspec: {data: {a: '2'}}\n",
        ),
    ]);

    // Sign in: the cookie is HttpOnly, Secure and SameSite=Strict.
    let signed = client
        .post(format!("{server}/ui/login"))
        .form(&[("token", token.as_str())])
        .send()
        .unwrap();
    assert_eq!(signed.status(), 303);
    let cookie = signed.headers()["set-cookie"].to_str().unwrap().to_string();
    for attribute in ["HttpOnly", "Secure", "SameSite=Strict", "Path=/"] {
        assert!(cookie.contains(attribute), "{cookie}");
    }
    let session = cookie.split(';').next().unwrap().to_string();
    let wrong = client
        .post(format!("{server}/ui/login"))
        .form(&[("token", "corral_not-a-token")])
        .send()
        .unwrap();
    assert_eq!(wrong.status(), 401);
    assert!(wrong.headers().get("set-cookie").is_none());

    // Pages: a strict policy, and the CSRF token in a meta tag.
    let page = client
        .get(format!("{server}/ui/"))
        .header("cookie", &session)
        .send()
        .unwrap();
    assert_eq!(page.status(), 200);
    let policy = page.headers()["content-security-policy"]
        .to_str()
        .unwrap()
        .to_string();
    assert!(policy.contains("default-src 'self'"), "{policy}");
    assert!(
        policy.contains("script-src 'self'") && !policy.contains("unsafe-inline"),
        "{policy}"
    );
    let html = page.text().unwrap();
    assert!(
        !html.contains("<script>") && !html.contains(" style="),
        "no inline script or style"
    );
    assert!(!html.contains(&token), "the token is never in the page");
    let csrf = html
        .split("name=\"corral-csrf\" content=\"")
        .nth(1)
        .and_then(|rest| rest.split('"').next())
        .unwrap()
        .to_string();

    // A write with the cookie but without the CSRF token is refused, as
    // is one with a wrong token or from another origin.
    let rollback = format!("{server}/v1/namespaces/default/configs/site/rollback");
    let body = json!({"to": 1, "message": "csrf test"}).to_string();
    let refused = client
        .post(&rollback)
        .header("cookie", &session)
        .header("content-type", "application/json")
        .body(body.clone())
        .send()
        .unwrap();
    assert_eq!(refused.status(), 403);
    assert!(refused.text().unwrap().contains("x-corral-csrf"));
    let wrong = client
        .post(&rollback)
        .header("cookie", &session)
        .header("x-corral-csrf", "0".repeat(64))
        .header("content-type", "application/json")
        .body(body.clone())
        .send()
        .unwrap();
    assert_eq!(wrong.status(), 403);
    let foreign = client
        .post(&rollback)
        .header("cookie", &session)
        .header("x-corral-csrf", &csrf)
        .header("origin", "https://evil.example")
        .header("content-type", "application/json")
        .body(body.clone())
        .send()
        .unwrap();
    assert_eq!(foreign.status(), 403);
    let history = cluster.ok(&["history", "config/site"]);
    assert!(
        !history.contains("csrf test"),
        "nothing was written: {history}"
    );

    // With it, the same write goes through, as the cookie's person.
    let done = client
        .post(&rollback)
        .header("cookie", &session)
        .header("x-corral-csrf", &csrf)
        .header("content-type", "application/json")
        .body(body)
        .send()
        .unwrap();
    assert_eq!(done.status(), 200, "{}", done.text().unwrap_or_default());
    let history = cluster.ok(&["history", "config/site"]);
    assert!(history.contains("csrf test"), "{history}");

    // Reads with the cookie need no CSRF token; no cookie, no access.
    let read = client
        .get(format!("{server}/v1/namespaces/default/configs/site"))
        .header("cookie", &session)
        .send()
        .unwrap();
    assert_eq!(read.status(), 200);
    let anonymous = client.get(format!("{server}/ui/")).send().unwrap();
    assert_eq!(anonymous.status(), 303);
    assert_eq!(anonymous.headers()["location"], "/ui/login");

    // The dashboard is for people: a controller's token gets no page.
    let controller = cluster
        .ok(&["token", "create", "--controller", "dash-test"])
        .trim()
        .to_string();
    let signed = client
        .post(format!("{server}/ui/login"))
        .form(&[("token", controller.as_str())])
        .send()
        .unwrap();
    let cookie = signed.headers()["set-cookie"].to_str().unwrap().to_string();
    let page = client
        .get(format!("{server}/ui/"))
        .header("cookie", cookie.split(';').next().unwrap())
        .send()
        .unwrap();
    assert_eq!(page.status(), 403);
    assert!(page.text().unwrap().contains("for people"));
}
