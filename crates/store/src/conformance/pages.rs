//! Checks of paged lists: pages cover every object exactly once, in order
//! within a namespace, and a continue position still works after the
//! objects around it changed.

use std::collections::BTreeMap;

use corral_api::{Kind, Object};
use serde_json::json;

use super::{alice, key, new_object, pod};
use crate::{ListContinue, ListPage, Store};

/// Every page of a walk with `limit`, from the start.
async fn walk(
    store: &dyn Store,
    kind: Kind,
    namespace: Option<&str>,
    limit: usize,
) -> Vec<ListPage> {
    let mut pages = Vec::new();
    let mut after: Option<ListContinue> = None;
    loop {
        let page = store
            .list_page(kind, namespace, limit, after.as_ref())
            .await
            .unwrap_or_else(|error| panic!("page {} with limit {limit}: {error}", pages.len()));
        assert!(
            page.objects.len() <= limit.max(1),
            "a page of limit {limit} holds {} objects",
            page.objects.len()
        );
        after = page.next.clone();
        let last = after.is_none();
        pages.push(page);
        if last {
            return pages;
        }
        assert!(
            pages.len() <= 1000,
            "a walk with limit {limit} does not end"
        );
    }
}

fn names(objects: &[Object]) -> Vec<(String, String)> {
    objects
        .iter()
        .map(|object| {
            let key = object.key();
            (key.namespace, key.name)
        })
        .collect()
}

/// Asserts that `walked` holds each of `expected` exactly once and that
/// names ascend within each namespace (the order across namespaces is the
/// backend's key order).
fn assert_covers(walked: &[(String, String)], expected: &[(String, String)], context: &str) {
    let mut counts: BTreeMap<&(String, String), usize> = BTreeMap::new();
    for entry in walked {
        *counts.entry(entry).or_default() += 1;
    }
    let repeated: Vec<_> = counts.iter().filter(|(_, count)| **count > 1).collect();
    assert!(
        repeated.is_empty(),
        "{context}: listed more than once: {repeated:?}"
    );
    let mut sorted_walk: Vec<_> = walked.to_vec();
    sorted_walk.sort();
    let mut sorted_expected = expected.to_vec();
    sorted_expected.sort();
    assert_eq!(
        sorted_walk, sorted_expected,
        "{context}: the pages hold every object"
    );
    let mut last_in: BTreeMap<&str, &str> = BTreeMap::new();
    for (namespace, name) in walked {
        if let Some(previous) = last_in.insert(namespace, name) {
            assert!(
                previous < name.as_str(),
                "{context}: in namespace {namespace:?}, {previous:?} came before {name:?}"
            );
        }
    }
}

/// Pages of every size cover everything exactly once; namespace filters,
/// cluster-wide kinds and the last page's `next` behave.
pub async fn check_list_pages(store: &dyn Store) {
    let empty = store
        .list_page(Kind::Pod, None, 10, None)
        .await
        .expect("page");
    assert!(
        empty.objects.is_empty() && empty.next.is_none(),
        "an empty store has one empty page"
    );

    for (namespace, count) in [("a", 9), ("a-b", 4), ("b", 7), ("ns2", 3)] {
        for index in 0..count {
            let name = format!("pod-{index:02}");
            store
                .create(
                    pod(
                        namespace,
                        &name,
                        &format!("uid-{namespace}-{name}"),
                        "img:1",
                    ),
                    &alice(0),
                )
                .await
                .expect("create");
        }
    }
    for index in 0..5 {
        let name = format!("node-{index}");
        store
            .create(
                new_object(Kind::Node, None, &name, &format!("uid-{name}"), json!({})),
                &alice(0),
            )
            .await
            .expect("create node");
    }
    let revision = store.current_revision().await.expect("revision");
    let all = store.list(Kind::Pod, None).await.expect("list");
    let everything = names(&all.objects);
    assert_eq!(everything.len(), 23);

    for limit in [0, 1, 2, 5, 7, 22, 23, 24, 500] {
        let pages = walk(store, Kind::Pod, None, limit).await;
        let walked: Vec<_> = pages.iter().flat_map(|page| names(&page.objects)).collect();
        assert_covers(&walked, &everything, &format!("limit {limit}"));
        assert!(
            pages.iter().all(|page| page.resource_version == revision),
            "limit {limit}: pages read with no write between are at the store revision"
        );
        let full = limit.max(1);
        assert!(
            pages[..pages.len() - 1]
                .iter()
                .all(|page| page.objects.len() == full),
            "limit {limit}: every page but the last is full"
        );
        if limit >= 23 {
            assert_eq!(
                pages.len(),
                1,
                "limit {limit}: one page when everything fits"
            );
        }
        // Namespaces without a `-` extension come in (namespace, name)
        // order on every backend.
        let plain: Vec<_> = walked
            .iter()
            .filter(|(ns, _)| ns != "a-b")
            .cloned()
            .collect();
        let plain_expected: Vec<_> = everything
            .iter()
            .filter(|(ns, _)| ns != "a-b")
            .cloned()
            .collect();
        assert_eq!(
            plain, plain_expected,
            "limit {limit}: (namespace, name) order"
        );
    }

    for namespace in ["a", "a-b", "b", "missing"] {
        let expected: Vec<_> = everything
            .iter()
            .filter(|(ns, _)| ns == namespace)
            .cloned()
            .collect();
        let walked: Vec<_> = walk(store, Kind::Pod, Some(namespace), 2)
            .await
            .iter()
            .flat_map(|page| names(&page.objects))
            .collect();
        assert_eq!(
            walked, expected,
            "pages of namespace {namespace:?}, in name order"
        );
    }

    let nodes: Vec<_> = walk(store, Kind::Node, None, 2)
        .await
        .iter()
        .flat_map(|page| names(&page.objects))
        .collect();
    let expected_nodes: Vec<_> = (0..5)
        .map(|index| (String::new(), format!("node-{index}")))
        .collect();
    assert_eq!(nodes, expected_nodes, "a cluster-wide kind pages by name");
    assert!(
        store
            .list_page(Kind::VirtualMachine, None, 3, None)
            .await
            .expect("page")
            .objects
            .is_empty(),
        "kinds do not mix"
    );
}

/// A continue position taken before deletes and inserts still works: the
/// rest of the walk holds every object after it that stayed, objects
/// created after it, none created before it, and nothing twice.
pub async fn check_list_continue_after_changes(store: &dyn Store) {
    for index in 0..12 {
        let name = format!("pod-{index:02}");
        store
            .create(
                pod("default", &name, &format!("uid-{name}"), "img:1"),
                &alice(0),
            )
            .await
            .expect("create");
    }
    let first = store
        .list_page(Kind::Pod, None, 4, None)
        .await
        .expect("first page");
    let first_names = names(&first.objects);
    let token = first.next.clone().expect("more than one page");
    assert_eq!(
        token,
        ListContinue {
            namespace: "default".into(),
            name: "pod-03".into()
        }
    );

    // The token's own object, one on a later page, and one on the first
    // page go; one sorting before the token and two after it come.
    for name in ["pod-03", "pod-07", "pod-01"] {
        store
            .delete(&key(Kind::Pod, Some("default"), name), None, &alice(1))
            .await
            .expect("delete");
    }
    for name in ["pod-00a", "pod-03a", "pod-99"] {
        store
            .create(
                pod("default", name, &format!("uid-{name}"), "img:1"),
                &alice(1),
            )
            .await
            .expect("create");
    }
    let changed = store.current_revision().await.expect("revision");
    let mut rest = Vec::new();
    let mut after = Some(token);
    while let Some(position) = after {
        let page = store
            .list_page(Kind::Pod, None, 4, Some(&position))
            .await
            .expect("next page");
        assert!(
            page.resource_version >= changed && page.resource_version > first.resource_version,
            "a later page is read at a later revision"
        );
        rest.extend(names(&page.objects));
        after = page.next;
    }
    let expected: Vec<(String, String)> = [
        "pod-03a", "pod-04", "pod-05", "pod-06", "pod-08", "pod-09", "pod-10", "pod-11", "pod-99",
    ]
    .iter()
    .map(|name| ("default".to_string(), name.to_string()))
    .collect();
    assert_eq!(rest, expected, "the walk goes on after the deleted token");
    assert!(
        rest.iter().all(|entry| !first_names.contains(entry)),
        "nothing on the first page comes again"
    );
}
