//! Paged lists through the API: `limit` and `continue`, the first page's
//! `resourceVersion` on every page, selectors that thin pages out, and bad
//! tokens.

mod common;

use axum::http::StatusCode;
use corral_api::Role;
use serde_json::{Value, json};

const PODS: &str = "/v1/namespaces/default/pods";

fn pod(name: &str, tier: &str) -> Value {
    json!({"kind": "Pod", "metadata": {"name": name, "labels": {"tier": tier}},
           "spec": {"containers": [{"name": "app", "image": "busybox"}]}})
}

/// Every page of `uri` (which carries `limit`), following `continue`.
async fn walk(server: &corral_server::SharedServer, token: &str, uri: &str) -> Vec<Value> {
    let mut pages = Vec::new();
    let mut next: Option<String> = None;
    loop {
        let uri = match &next {
            Some(position) => format!("{uri}&continue={position}"),
            None => uri.to_string(),
        };
        let (status, body) = common::call(server, "GET", &uri, Some(token), None).await;
        assert_eq!(status, StatusCode::OK, "{uri}: {body}");
        next = body
            .get("continue")
            .and_then(Value::as_str)
            .map(str::to_string);
        pages.push(body);
        if next.is_none() {
            return pages;
        }
        assert!(pages.len() < 100, "the walk of {uri} does not end");
    }
}

fn names(pages: &[Value]) -> Vec<String> {
    pages
        .iter()
        .flat_map(|page| page["items"].as_array().cloned().unwrap_or_default())
        .map(|item| {
            item["metadata"]["name"]
                .as_str()
                .unwrap_or_default()
                .to_string()
        })
        .collect()
}

#[tokio::test]
async fn pages_cover_the_list_and_carry_the_first_revision() {
    let server = common::new_server();
    let admin = common::token(&server, "admin", Role::Operator).await;
    for index in 0..7 {
        let tier = if index % 2 == 0 { "web" } else { "db" };
        let name = format!("pod-{index}");
        let (status, body) = common::call(
            &server,
            "PUT",
            &format!("{PODS}/{name}"),
            Some(&admin),
            Some(pod(&name, tier)),
        )
        .await;
        assert!(status.is_success(), "{body}");
    }
    let (_, whole) = common::call(&server, "GET", PODS, Some(&admin), None).await;
    assert!(
        whole.get("continue").is_none(),
        "an unpaged list has no token"
    );
    let all: Vec<String> = names(std::slice::from_ref(&whole));
    assert_eq!(all.len(), 7);

    let pages = walk(&server, &admin, &format!("{PODS}?limit=3")).await;
    assert_eq!(pages.len(), 3, "7 pods in pages of 3");
    assert_eq!(names(&pages), all, "pages cover the list in order, once");
    let first = pages[0]["resourceVersion"].clone();

    // A write between pages: later pages still carry the first revision.
    let (status, _) = common::call(
        &server,
        "PUT",
        &format!("{PODS}/pod-9"),
        Some(&admin),
        Some(pod("pod-9", "web")),
    )
    .await;
    assert!(status.is_success());
    let token = pages[0]["continue"].as_str().expect("a token").to_string();
    let (status, second) = common::call(
        &server,
        "GET",
        &format!("{PODS}?limit=3&continue={token}"),
        Some(&admin),
        None,
    )
    .await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(
        second["resourceVersion"], first,
        "every page: the first revision"
    );
    assert_eq!(names(&[second]), ["pod-3", "pod-4", "pod-5"]);

    // A selector fills pages from further on.
    let web = walk(
        &server,
        &admin,
        &format!("{PODS}?limit=2&selector=tier%3Dweb"),
    )
    .await;
    assert_eq!(names(&web), ["pod-0", "pod-2", "pod-4", "pod-6", "pod-9"]);
    assert!(
        web.iter().all(|page| page["items"]
            .as_array()
            .is_some_and(|items| items.len() <= 2)),
        "no page holds more than the limit"
    );

    // Across namespaces too.
    let everywhere = walk(&server, &admin, "/v1/pods?limit=5").await;
    assert_eq!(names(&everywhere).len(), 8);
}

#[tokio::test]
async fn a_bad_continue_token_is_400_naming_the_parameter() {
    let server = common::new_server();
    let admin = common::token(&server, "admin", Role::Operator).await;
    for token in ["nothex", "7b7d", ""] {
        let (status, body) = common::call(
            &server,
            "GET",
            &format!("{PODS}?limit=2&continue={token}"),
            Some(&admin),
            None,
        )
        .await;
        if token.is_empty() {
            assert_eq!(status, StatusCode::OK, "an empty token is no token: {body}");
            continue;
        }
        assert_eq!(status, StatusCode::BAD_REQUEST, "{token:?}: {body}");
        let message = body["message"].as_str().unwrap_or_default();
        assert!(message.contains("continue"), "{message}");
    }
    let (status, body) = common::call(
        &server,
        "GET",
        &format!("{PODS}?limit=many"),
        Some(&admin),
        None,
    )
    .await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{body}");
}
