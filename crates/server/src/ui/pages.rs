//! The dashboard's pages: server-rendered HTML shells that name what they
//! show in `data-` attributes; `assets/app.js` fills them from the API
//! (and [`super::parts`]) and keeps them live. No inline script or style:
//! the Content-Security-Policy in [`super::headers`] forbids both.

use axum::extract::{Path, Query};
use axum::http::StatusCode;
use axum::http::header::CONTENT_TYPE;
use axum::response::{IntoResponse, Response};
use corral_api::{Identity, Kind, Role};
use serde::Deserialize;

use super::session::Session;

/// `text` with HTML's special characters escaped (for text and attributes).
pub fn escape(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&#39;"),
            c => out.push(c),
        }
    }
    out
}

/// The namespace a person's overview opens on: `default` when they may
/// act there, else the first they may.
pub fn default_namespace(identity: &Identity) -> String {
    if identity.role != Role::User
        || identity
            .namespaces
            .iter()
            .any(|n| n == "*" || n == "default")
    {
        return "default".into();
    }
    identity
        .namespaces
        .first()
        .cloned()
        .unwrap_or_else(|| "default".into())
}

/// A whole page: `main` goes inside `<main>` with the `data-` attributes
/// given (already escaped values).
fn page(title: &str, session: Option<&Session>, data: &[(&str, &str)], main: &str) -> Response {
    let attributes: String = data
        .iter()
        .map(|(name, value)| format!(" data-{name}=\"{}\"", escape(value)))
        .collect();
    let (csrf, header) = match session {
        Some(session) => (
            format!("<meta name=\"corral-csrf\" content=\"{}\">", session.csrf),
            format!(
                "<nav><a class=\"brand\" href=\"/ui/\">corral</a><a href=\"/ui/\">Overview</a>\
                 <a href=\"/ui/apply\">Apply</a><span class=\"who\">{} ({})</span>\
                 <button id=\"sign-out\" type=\"button\">Sign out</button></nav>",
                escape(&session.caller.name),
                escape(&format!("{:?}", session.caller.role).to_lowercase())
            ),
        ),
        None => (
            String::new(),
            "<nav><span class=\"brand\">corral</span></nav>".into(),
        ),
    };
    let html = format!(
        "<!doctype html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">\
         <meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">{csrf}\
         <title>{} · corral</title><link rel=\"stylesheet\" href=\"/ui/assets/app.css\">\
         <script type=\"module\" src=\"/ui/assets/app.js\"></script></head>\
         <body>{header}<main{attributes}>{main}</main></body></html>\n",
        escape(title)
    );
    ([(CONTENT_TYPE, "text/html; charset=utf-8")], html).into_response()
}

/// The sign-in form, with the reason the last attempt failed.
pub fn sign_in_page(error: Option<&str>) -> Response {
    let error = error
        .map(|e| format!("<p class=\"error\" id=\"sign-in-error\">{}</p>", escape(e)))
        .unwrap_or_default();
    let main = format!(
        "<h1>Sign in</h1>{error}<form method=\"post\" action=\"/ui/login\" id=\"sign-in\">\
         <label>Token <input type=\"password\" name=\"token\" id=\"token\" autocomplete=\"off\" required></label>\
         <button type=\"submit\" id=\"sign-in-button\">Sign in</button></form>\
         <p class=\"hint\">A corral token: <code>corral token create --user NAME --namespace NS</code>, \
         or the admin token in the config <code>corral up</code> wrote.</p>"
    );
    let mut response = page("Sign in", None, &[("page", "sign-in")], &main);
    if !error.is_empty() {
        *response.status_mut() = StatusCode::UNAUTHORIZED;
    }
    response
}

#[derive(Debug, Deserialize)]
pub struct SignInQuery {
    expired: Option<String>,
}

/// `GET /ui/login`.
pub async fn sign_in_form(Query(query): Query<SignInQuery>) -> Response {
    sign_in_page(
        query
            .expired
            .is_some()
            .then_some("your session ended: sign in again"),
    )
}

#[derive(Debug, Deserialize)]
pub struct NamespaceQuery {
    pub namespace: Option<String>,
}

impl NamespaceQuery {
    pub fn or_default(&self, identity: &Identity) -> String {
        self.namespace
            .clone()
            .filter(|n| !n.is_empty())
            .unwrap_or_else(|| default_namespace(identity))
    }
}

/// `GET /ui/`: every kind's table for one namespace, filled and kept live
/// from `/ui/live`.
pub async fn overview(session: Session, Query(query): Query<NamespaceQuery>) -> Response {
    let namespace = query.or_default(&session.caller);
    let main = format!(
        "<form class=\"namespace\" method=\"get\" action=\"/ui/\"><label>Namespace \
         <input name=\"namespace\" id=\"namespace\" value=\"{}\"></label><button type=\"submit\">Show</button></form>\
         <p id=\"live-state\" class=\"hint\">connecting…</p><div id=\"tables\"></div>",
        escape(&namespace)
    );
    page(
        "Overview",
        Some(&session),
        &[("page", "overview"), ("namespace", &namespace)],
        &main,
    )
}

/// `GET /ui/objects/{plural}/{name}?namespace=NS`: spec and status, the
/// workflow graph, history with diffs and rollback, step logs, and for
/// pods their logs and for VMs their console.
pub async fn object(
    session: Session,
    Path((plural, name)): Path<(String, String)>,
    Query(query): Query<NamespaceQuery>,
) -> Response {
    let Ok(kind) = plural.parse::<Kind>() else {
        return (StatusCode::NOT_FOUND, format!("no kind {plural}")).into_response();
    };
    let namespace = if kind.is_namespaced() {
        query.or_default(&session.caller)
    } else {
        String::new()
    };
    let extra = match kind {
        Kind::Pod => {
            "<section><h2>Logs</h2><label>Container <input id=\"log-container\"></label>\
             <button type=\"button\" id=\"logs-follow\">Follow</button><pre id=\"logs\" class=\"term\"></pre></section>"
        }
        Kind::VirtualMachine => {
            "<section><h2>Power</h2>\
             <button type=\"button\" id=\"vm-stop\">Stop</button> \
             <button type=\"button\" id=\"vm-start\">Start</button> \
             <button type=\"button\" id=\"vm-restart\">Restart</button> \
             <button type=\"button\" id=\"vm-reset\">Reset</button> <span id=\"power-result\"></span>\
             <p class=\"hint\">Stop: the ACPI power button, the grace period, then off — its disks, address and node are kept until Start. \
             Start: a fresh boot from its disks. Restart: a clean stop and a fresh start. Reset: the reset button.</p></section>\
             <section><h2>Console</h2>\
             <button type=\"button\" id=\"console-open\">Connect</button> <span id=\"console-state\" class=\"hint\"></span>\
             <pre id=\"console\" class=\"term\" tabindex=\"0\"></pre></section>"
        }
        _ => "",
    };
    let main = format!(
        "<h1>{} <span class=\"ns\">{}</span></h1>\
         <section><div class=\"part\" data-part=\"summary\">loading…</div></section>\
         <section id=\"why\"><h2>Workflow</h2><div class=\"part\" data-part=\"why\">loading…</div></section>\
         <section id=\"history\"><h2>History</h2><div class=\"part\" data-part=\"history\">loading…</div>\
         <form id=\"diff-form\" class=\"inline\"><label>From <input id=\"diff-from\" size=\"4\"></label>\
         <label>To <input id=\"diff-to\" size=\"4\"></label><button type=\"submit\">Diff</button></form>\
         <div id=\"diff\"></div>\
         <form id=\"rollback-form\" class=\"inline\"><label>Roll back to <input id=\"rollback-to\" size=\"4\"></label>\
         <label>Message <input id=\"rollback-message\" size=\"40\" required></label>\
         <button type=\"submit\" id=\"rollback-button\">Roll back</button></form><p id=\"rollback-result\"></p></section>\
         {extra}\
         <section><h2>Spec and status</h2><div class=\"part\" data-part=\"object\">loading…</div></section>\
         <section><h2>Step logs</h2><div class=\"part\" data-part=\"steplogs\">loading…</div></section>\
         <section><h2>Delete</h2><form id=\"delete-form\" class=\"inline\">\
         <label>Message <input id=\"delete-message\" size=\"40\"></label>\
         <button type=\"submit\" id=\"delete-button\">Delete</button></form><p id=\"delete-result\"></p></section>",
        escape(&format!("{}/{name}", kind.short())),
        escape(&namespace)
    );
    page(
        &format!("{}/{name}", kind.short()),
        Some(&session),
        &[
            ("page", "object"),
            ("plural", kind.plural()),
            ("namespace", &namespace),
            ("name", &name),
        ],
        &main,
    )
}

/// `GET /ui/apply`: paste a manifest (or load a file into the box);
/// errors come back with field paths.
pub async fn apply(session: Session, Query(query): Query<NamespaceQuery>) -> Response {
    let namespace = query.or_default(&session.caller);
    let main = format!(
        "<h1>Apply a manifest</h1><form id=\"apply-form\"><label>Namespace <input id=\"apply-namespace\" value=\"{}\"></label>\
         <label>or upload a file <input type=\"file\" id=\"manifest-file\" accept=\".yaml,.yml,.json\"></label>\
         <textarea id=\"manifest\" rows=\"20\" cols=\"80\" spellcheck=\"false\"></textarea>\
         <button type=\"submit\" id=\"apply-button\">Apply</button></form><pre id=\"apply-result\"></pre>",
        escape(&namespace)
    );
    page("Apply", Some(&session), &[("page", "apply")], &main)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn escaping_leaves_no_markup() {
        assert_eq!(
            escape("<a href=\"x\">'&'</a>"),
            "&lt;a href=&quot;x&quot;&gt;&#39;&amp;&#39;&lt;/a&gt;"
        );
    }

    #[test]
    fn a_user_opens_on_a_namespace_they_may_see() {
        let mut user = Identity::new("ann", Role::User);
        user.namespaces = vec!["team-b".into()];
        assert_eq!(default_namespace(&user), "team-b");
        user.namespaces.push("default".into());
        assert_eq!(default_namespace(&user), "default");
        assert_eq!(
            default_namespace(&Identity::new("root", Role::Operator)),
            "default"
        );
    }
}
