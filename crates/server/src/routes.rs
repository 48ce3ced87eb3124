//! The route table: every path the API serves, each method's handler and
//! its OpenAPI operation, side by side. [`crate::app`] builds the router
//! from it and [`crate::openapi::document`] the document's paths, so a
//! route cannot be served undocumented (a test checks both against each
//! other, request by request).

use axum::Router;
use axum::handler::Handler;
use axum::http::Method;
use axum::routing::{MethodRouter, on};
use serde_json::Value;

use crate::SharedServer;
use crate::openapi::objects::ObjectDocs;
use crate::openapi::system as docs;

/// One method of a route: its handler and its OpenAPI operation.
struct Operation {
    method: Method,
    handler: MethodRouter<SharedServer>,
    doc: Value,
}

/// One path and what each of its methods does.
pub struct Route {
    path: String,
    operations: Vec<Operation>,
}

impl std::fmt::Debug for Route {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Route")
            .field("path", &self.path)
            .field(
                "methods",
                &self
                    .operations
                    .iter()
                    .map(|o| &o.method)
                    .collect::<Vec<_>>(),
            )
            .finish()
    }
}

impl Route {
    fn new(path: impl Into<String>) -> Route {
        Route {
            path: path.into(),
            operations: Vec::new(),
        }
    }

    fn method<H, T>(mut self, method: Method, handler: H, doc: Value) -> Route
    where
        H: Handler<T, SharedServer>,
        T: 'static,
    {
        // INVARIANT: the methods used below are the standard ones axum filters on.
        #[allow(clippy::unwrap_used)]
        let filter = method.clone().try_into().unwrap();
        self.operations.push(Operation {
            method,
            handler: on(filter, handler),
            doc,
        });
        self
    }

    fn get<H: Handler<T, SharedServer>, T: 'static>(self, handler: H, doc: Value) -> Route {
        self.method(Method::GET, handler, doc)
    }

    fn post<H: Handler<T, SharedServer>, T: 'static>(self, handler: H, doc: Value) -> Route {
        self.method(Method::POST, handler, doc)
    }

    fn put<H: Handler<T, SharedServer>, T: 'static>(self, handler: H, doc: Value) -> Route {
        self.method(Method::PUT, handler, doc)
    }

    fn delete<H: Handler<T, SharedServer>, T: 'static>(self, handler: H, doc: Value) -> Route {
        self.method(Method::DELETE, handler, doc)
    }

    /// The path as axum matches it (`/v1/{plural}/{name}`).
    pub fn path(&self) -> &str {
        &self.path
    }

    /// Each method with its OpenAPI operation.
    pub fn operations(&self) -> impl Iterator<Item = (&Method, &Value)> {
        self.operations.iter().map(|o| (&o.method, &o.doc))
    }
}

/// Every route of the API.
pub fn table() -> Vec<Route> {
    use crate::handlers::{
        history, image_import, lease, node_certificate, node_images, secrets, system, tokens,
    };
    use crate::ownership;

    let mut table = vec![
        Route::new("/healthz").get(system::healthz, docs::healthz()),
        Route::new("/metrics").get(system::metrics, docs::metrics()),
        Route::new("/v1/openapi.json").get(system::openapi, docs::openapi()),
        Route::new("/v1/whoami").get(system::whoami, docs::whoami()),
        Route::new("/v1/tokens")
            .get(tokens::list, docs::list_tokens())
            .post(system::create_token, docs::create_token()),
        Route::new("/v1/tokens/{token}").delete(tokens::revoke, docs::revoke_token()),
        Route::new("/v1/join").post(system::join, docs::join()),
        Route::new("/v1/history").get(history::cluster_history, docs::cluster_history()),
        Route::new("/v1/secrets/rotate-key").post(secrets::rotate_key, docs::rotate_key()),
        Route::new("/v1/controllers/{name}/transfer").post(ownership::transfer, docs::transfer()),
        Route::new("/v1/nodes/{name}/lease")
            .get(lease::read, docs::read_lease())
            .put(lease::renew, docs::renew_lease()),
        Route::new("/v1/nodes/{name}/certificate")
            .post(node_certificate::issue, docs::node_certificate()),
        Route::new("/v1/nodes/{name}/images/prune").post(node_images::prune, docs::prune_images()),
        Route::new("/v1/images").get(image_import::list, docs::list_images()),
        Route::new("/v1/images/import").post(image_import::import, docs::import_images()),
    ];
    let namespaced: Vec<&str> = corral_api::Kind::ALL
        .iter()
        .filter(|k| k.is_namespaced())
        .map(|k| k.plural())
        .collect();
    let every: Vec<&str> = corral_api::Kind::ALL.iter().map(|k| k.plural()).collect();
    table.extend(object_routes(
        "/v1/namespaces/{namespace}",
        &ObjectDocs::new(&namespaced.join(", "), true),
    ));
    table.extend(object_routes(
        "/v1",
        &ObjectDocs::new(&every.join(", "), false),
    ));
    table
}

/// The object routes under `prefix`: namespaced kinds under
/// `/v1/namespaces/{namespace}`, cluster-wide kinds (and lists across
/// namespaces) under `/v1`.
fn object_routes(prefix: &str, docs: &ObjectDocs) -> Vec<Route> {
    use crate::handlers::{history, objects, pods_io, secrets, steps, watch};

    let path = |suffix: &str| format!("{prefix}/{{plural}}{suffix}");
    vec![
        Route::new(path(""))
            .get(watch::list_or_watch, docs.list())
            .post(objects::create, docs.create()),
        Route::new(path("/{name}"))
            .get(objects::get_one, docs.get())
            .put(objects::apply, docs.apply())
            .delete(objects::delete, docs.delete()),
        Route::new(path("/{name}/status")).put(objects::put_status, docs.put_status()),
        Route::new(path("/{name}/history")).get(history::object_history, docs.history()),
        Route::new(path("/{name}/history/{revision}")).get(history::one_revision, docs.revision()),
        Route::new(path("/{name}/diff")).get(history::diff, docs.diff()),
        Route::new(path("/{name}/rollback")).post(history::rollback, docs.rollback()),
        Route::new(path("/{name}/steps")).post(steps::act, docs.steps()),
        Route::new(path("/{name}/retry")).post(steps::retry, docs.retry()),
        Route::new(path("/{name}/recoveries")).post(steps::record_recovery, docs.recoveries()),
        Route::new(path("/{name}/reveal")).get(secrets::reveal, docs.reveal()),
        Route::new(path("/{name}/steplogs")).get(steps::logs, docs.steplogs()),
        Route::new(path("/{name}/workflows")).get(steps::instances, docs.workflows()),
        Route::new(path("/{name}/logs")).get(pods_io::logs, docs.logs()),
        Route::new(path("/{name}/exec")).post(pods_io::exec, docs.exec()),
        Route::new(path("/{name}/portforward")).post(pods_io::port_forward, docs.port_forward()),
        Route::new(path("/{name}/console")).post(pods_io::console, docs.console()),
    ]
}

/// The router of `table`, every method of a path on one route.
pub(crate) fn router(table: Vec<Route>) -> Router<SharedServer> {
    table.into_iter().fold(Router::new(), |router, route| {
        let methods = route
            .operations
            .into_iter()
            .fold(MethodRouter::new(), |methods, operation| {
                methods.merge(operation.handler)
            });
        router.route(&route.path, methods)
    })
}
