//! Namespace scoping of users: a user token names the namespaces its
//! person may act in (`*` for all). Every request is checked against its
//! path before any handler runs: namespaced objects only in granted
//! namespaces, cluster-wide objects read-only, cluster-wide history and
//! token minting not at all. A join token may only join a node.
//! Operators, controllers and nodes are not scoped here (field ownership
//! limits controllers and nodes).

use axum::http::Method;
use corral_api::{Identity, Kind, Role};

use crate::error::ApiError;

/// Whether `identity` may make this request; the refusal names the rule.
pub fn check(
    identity: &Identity,
    method: &Method,
    path: &str,
    query: Option<&str>,
) -> Result<(), ApiError> {
    if identity.role == Role::Joiner {
        let path = path.trim_end_matches('/');
        return match (method, path) {
            (&Method::POST, "/v1/join") | (&Method::GET, "/v1/whoami") => Ok(()),
            _ => Err(ApiError::Forbidden(format!(
                "{} is a join token: it may only join a node (POST /v1/join, as `corral agent --join-token` does)",
                identity.name
            ))),
        };
    }
    if identity.role != Role::User || identity.namespaces.iter().any(|n| n == "*") {
        return Ok(());
    }
    let granted = |namespace: &str| identity.namespaces.iter().any(|n| n == namespace);
    let refuse = |what: String| {
        Err(ApiError::Forbidden(format!(
            "user {} may act only in namespaces {}: {what}",
            identity.name,
            shown(&identity.namespaces)
        )))
    };
    let segments: Vec<&str> = path.trim_matches('/').split('/').collect();
    match segments.as_slice() {
        ["v1", "namespaces", namespace, ..] if !granted(namespace) => {
            refuse(format!("namespace {namespace} is not one of them"))
        }
        ["v1", "namespaces", ..] => Ok(()),
        ["v1", "history"] => refuse("the cluster-wide history is for operators".into()),
        ["v1", plural, rest @ ..] => match plural.parse::<Kind>().ok() {
            Some(kind) if kind.is_namespaced() => {
                let namespace = query_namespace(query);
                match (namespace.as_deref(), rest.is_empty()) {
                    (Some(namespace), _) if granted(namespace) => Ok(()),
                    (Some(namespace), _) => {
                        refuse(format!("namespace {namespace} is not one of them"))
                    }
                    (None, true) => refuse(format!(
                        "listing {plural} across all namespaces is not allowed; name a namespace"
                    )),
                    (None, false) if granted("default") => Ok(()),
                    (None, false) => refuse("namespace default is not one of them".into()),
                }
            }
            Some(_) if method == Method::GET => Ok(()),
            Some(kind) => refuse(format!(
                "{} objects are cluster-wide; users may only read them",
                kind.as_str()
            )),
            None => Ok(()),
        },
        _ => Ok(()),
    }
}

fn query_namespace(query: Option<&str>) -> Option<String> {
    query?
        .split('&')
        .filter_map(|pair| pair.split_once('='))
        .find(|(key, value)| *key == "namespace" && !value.is_empty())
        .map(|(_, value)| value.to_string())
}

fn shown(namespaces: &[String]) -> String {
    if namespaces.is_empty() {
        "(none)".to_string()
    } else {
        namespaces.join(", ")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn alice() -> Identity {
        Identity::new("alice", Role::User).with_namespaces(vec!["team-a".into()])
    }

    fn allowed(method: Method, path: &str, query: Option<&str>) -> bool {
        check(&alice(), &method, path, query).is_ok()
    }

    #[test]
    fn users_act_only_in_their_namespaces() {
        assert!(allowed(Method::PUT, "/v1/namespaces/team-a/pods/web", None));
        assert!(allowed(Method::GET, "/v1/pods", Some("namespace=team-a")));
        let error = check(
            &alice(),
            &Method::PUT,
            "/v1/namespaces/team-b/pods/web",
            None,
        )
        .expect_err("another namespace");
        assert_eq!(
            error.to_string(),
            "user alice may act only in namespaces team-a: namespace team-b is not one of them"
        );
        assert!(!allowed(Method::GET, "/v1/pods", None), "all namespaces");
        assert!(!allowed(Method::GET, "/v1/pods/web", None), "default");
        assert!(!allowed(Method::GET, "/v1/history", None));
    }

    #[test]
    fn users_read_but_never_write_cluster_wide_objects() {
        assert!(allowed(Method::GET, "/v1/nodes", None));
        assert!(allowed(Method::GET, "/v1/policies/p", None));
        let error = check(&alice(), &Method::PUT, "/v1/policies/p", None).expect_err("policy");
        assert!(
            error
                .to_string()
                .contains("Policy objects are cluster-wide"),
            "{error}"
        );
    }

    #[test]
    fn others_are_not_scoped_here() {
        let everywhere = Identity::new("bob", Role::User).with_namespaces(vec!["*".into()]);
        assert!(check(&everywhere, &Method::GET, "/v1/history", None).is_ok());
        let operator = Identity::new("root", Role::Operator);
        assert!(check(&operator, &Method::PUT, "/v1/policies/p", None).is_ok());
        assert!(allowed(Method::GET, "/v1/whoami", None));
    }
}
