//! Prometheus metrics in the text exposition format, kept with atomics and
//! one small map; no registry crate needed for this handful.

use std::collections::BTreeMap;
use std::sync::Mutex;
use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};
use std::time::Instant;

use axum::extract::{MatchedPath, Request, State};
use axum::middleware::Next;
use axum::response::Response;

use crate::SharedServer;

/// (method, route pattern, status) of a request.
type RequestLabels = (String, String, u16);

/// How many requests, and their seconds summed.
type RequestTotals = (u64, f64);

#[derive(Debug, Default)]
pub struct Metrics {
    requests: Mutex<BTreeMap<RequestLabels, RequestTotals>>,
    watches: AtomicI64,
    /// Unix milliseconds since which this server runs the built-in
    /// controllers (it leads), 0 while it does not.
    leading_since: AtomicU64,
    /// How many times this server started leading.
    terms: AtomicU64,
}

impl Metrics {
    /// Records that this server started (`true`) or stopped running the
    /// built-in controllers: always on SQLite, while it leads on etcd.
    pub fn set_leading(&self, leading: bool) {
        let since = if leading {
            u64::try_from(chrono::Utc::now().timestamp_millis())
                .unwrap_or(1)
                .max(1)
        } else {
            0
        };
        let was = self.leading_since.swap(since, Ordering::SeqCst);
        if leading && was == 0 {
            self.terms.fetch_add(1, Ordering::Relaxed);
        }
    }

    pub fn watch_started(&self) {
        self.watches.fetch_add(1, Ordering::Relaxed);
    }

    pub fn watch_ended(&self) {
        self.watches.fetch_sub(1, Ordering::Relaxed);
    }

    fn observe(&self, method: &str, route: &str, status: u16, seconds: f64) {
        if let Ok(mut requests) = self.requests.lock() {
            let entry = requests
                .entry((method.to_string(), route.to_string(), status))
                .or_default();
            entry.0 += 1;
            entry.1 += seconds;
        }
    }

    /// The text exposition of every metric, plus the store's gauges.
    pub fn render(&self, store_revision: u64, history: corral_store::HistorySize) -> String {
        let mut out = String::new();
        out.push_str("# HELP corral_http_requests_total HTTP requests served.\n");
        out.push_str("# TYPE corral_http_requests_total counter\n");
        let requests = self.requests.lock().map(|r| r.clone()).unwrap_or_default();
        for ((method, route, status), (count, _)) in &requests {
            out.push_str(&format!(
                "corral_http_requests_total{{method=\"{method}\",route=\"{route}\",status=\"{status}\"}} {count}\n"
            ));
        }
        out.push_str("# HELP corral_http_request_seconds_sum Time spent serving HTTP requests.\n");
        out.push_str("# TYPE corral_http_request_seconds_sum counter\n");
        for ((method, route, status), (_, seconds)) in &requests {
            out.push_str(&format!(
                "corral_http_request_seconds_sum{{method=\"{method}\",route=\"{route}\",status=\"{status}\"}} {seconds:.6}\n"
            ));
        }
        out.push_str("# HELP corral_watch_streams Open watch streams.\n");
        out.push_str("# TYPE corral_watch_streams gauge\n");
        out.push_str(&format!(
            "corral_watch_streams {}\n",
            self.watches.load(Ordering::Relaxed)
        ));
        out.push_str(
            "# HELP corral_controllers_leading 1 while this server runs the built-in controllers (it leads).\n",
        );
        out.push_str("# TYPE corral_controllers_leading gauge\n");
        let since = self.leading_since.load(Ordering::SeqCst);
        out.push_str(&format!(
            "corral_controllers_leading {}\n",
            u8::from(since > 0)
        ));
        out.push_str(
            "# HELP corral_controllers_leading_since_seconds Unix time this server's current leadership began (0: not leading).\n",
        );
        out.push_str("# TYPE corral_controllers_leading_since_seconds gauge\n");
        out.push_str(&format!(
            "corral_controllers_leading_since_seconds {}.{:03}\n",
            since / 1000,
            since % 1000
        ));
        out.push_str(
            "# HELP corral_controller_leadership_terms_total Times this server began leading.\n",
        );
        out.push_str("# TYPE corral_controller_leadership_terms_total counter\n");
        out.push_str(&format!(
            "corral_controller_leadership_terms_total {}\n",
            self.terms.load(Ordering::Relaxed)
        ));
        out.push_str("# HELP corral_store_revision The newest store revision.\n");
        out.push_str("# TYPE corral_store_revision gauge\n");
        out.push_str(&format!("corral_store_revision {store_revision}\n"));
        out.push_str("# HELP corral_history_revisions Spec revisions kept in history.\n");
        out.push_str("# TYPE corral_history_revisions gauge\n");
        out.push_str(&format!("corral_history_revisions {}\n", history.revisions));
        out.push_str("# HELP corral_history_stored_bytes Bytes of history specs as stored (delta-compressed).\n");
        out.push_str("# TYPE corral_history_stored_bytes gauge\n");
        out.push_str(&format!(
            "corral_history_stored_bytes {}\n",
            history.stored_bytes
        ));
        out.push_str("# HELP corral_history_raw_bytes Bytes the same specs take as full copies.\n");
        out.push_str("# TYPE corral_history_raw_bytes gauge\n");
        out.push_str(&format!("corral_history_raw_bytes {}\n", history.raw_bytes));
        out
    }
}

/// Middleware counting every request by route pattern and status.
pub async fn record_request(
    State(server): State<SharedServer>,
    request: Request,
    next: Next,
) -> Response {
    let method = request.method().to_string();
    let route = request
        .extensions()
        .get::<MatchedPath>()
        .map_or_else(|| "unmatched".to_string(), |p| p.as_str().to_string());
    let started = Instant::now();
    let response = next.run(request).await;
    server.metrics.observe(
        &method,
        &route,
        response.status().as_u16(),
        started.elapsed().as_secs_f64(),
    );
    response
}
