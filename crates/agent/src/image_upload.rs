//! The agent's image endpoints, what `corral image import` and `corral
//! image ls` reach through the API server (over the agent channel's TLS,
//! as for logs and exec):
//!
//! - `POST /v1/images/import?name=REF` imports the archive in the request
//!   body (an OCI layout or docker-archive tar) into this node's image
//!   store and answers the images it imported. The body streams into the
//!   store's import on a blocking thread; nothing is named before every
//!   blob's digest is checked, so a cut or corrupt upload imports nothing.
//! - `GET /v1/images` answers every image in the store, its size and the
//!   pods here that use it.
//!
//! The agent owns its image store: importing here, in the process that
//! pulls and collects, means no second process writes the store.

use std::io::{self, Read};
use std::path::Path;

use axum::Json;
use axum::extract::{RawQuery, Request, State};
use bytes::{Buf, Bytes};
use corral_api::kinds::{NodeImage, PodSpec};
use corral_runtime::image::{Image, ImageError, ImageStore, Reference};
use futures::StreamExt;
use tokio::sync::mpsc;

use crate::serve::{EndpointError, Shared, parse_query, single};
use crate::state::PodRecord;

/// How the upload is named in import errors.
const UPLOAD: &str = "the uploaded archive";
/// Body chunks in flight between the connection and the importing thread.
const CHUNKS_IN_FLIGHT: usize = 16;

/// The request body as a blocking reader: the async side sends its chunks
/// (or the error that broke it off) over a channel; its end is the end of
/// the body.
struct ChannelReader {
    chunks: mpsc::Receiver<io::Result<Bytes>>,
    current: Bytes,
}

impl Read for ChannelReader {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        while self.current.is_empty() {
            match self.chunks.blocking_recv() {
                Some(Ok(chunk)) => self.current = chunk,
                Some(Err(error)) => return Err(error),
                None => return Ok(0),
            }
        }
        let n = buf.len().min(self.current.len());
        buf[..n].copy_from_slice(&self.current[..n]);
        self.current.advance(n);
        Ok(n)
    }
}

/// `POST /v1/images/import?name=REF`.
pub(crate) async fn import(
    State(endpoint): State<Shared>,
    RawQuery(query): RawQuery,
    request: Request,
) -> Result<Json<Vec<NodeImage>>, EndpointError> {
    let params = parse_query(query.as_deref());
    let name = single(&params, "name")
        .filter(|name| !name.is_empty())
        .map(str::to_string);
    if let Some(name) = &name {
        name.parse::<Reference>().map_err(|error| {
            EndpointError::BadRequest(format!("name: {name:?} is not an image reference: {error}"))
        })?;
    }
    let (sender, chunks) = mpsc::channel(CHUNKS_IN_FLIGHT);
    let images = endpoint.ctx.runner.images.clone();
    let importing = tokio::task::spawn_blocking(move || {
        let mut reader = ChannelReader {
            chunks,
            current: Bytes::new(),
        };
        let imported = images.import_reader(&mut reader, Path::new(UPLOAD), name.as_deref());
        if imported.is_ok() {
            // The tar's padding after its end; reading it lets the
            // connection finish the request cleanly.
            let _ = io::copy(&mut reader, &mut io::sink());
        }
        imported.map(|imported| {
            imported
                .iter()
                .map(|image| summary(image, Vec::new()))
                .collect::<Vec<_>>()
        })
    });
    let mut body = request.into_body().into_data_stream();
    while let Some(chunk) = body.next().await {
        let chunk = chunk.map_err(io::Error::other);
        let broken = chunk.is_err();
        // A closed channel means the import ended (it failed, or the
        // archive ended): the rest of the body is not needed.
        if sender.send(chunk).await.is_err() || broken {
            break;
        }
    }
    drop(sender);
    let imported = importing
        .await
        .map_err(|error| EndpointError::Internal(error.to_string()))?
        .map_err(|error| {
            let message = format!(
                "import failed, nothing was imported: {}",
                crate::chain(&error)
            );
            match error {
                // The node's disk, not the archive.
                ImageError::Io { .. } | ImageError::Mount(_) => EndpointError::Internal(message),
                _ => EndpointError::BadRequest(message),
            }
        })?;
    for image in &imported {
        tracing::info!(image = %image.reference, digest = %image.digest, "image imported through the API");
    }
    Ok(Json(imported))
}

/// `GET /v1/images`.
pub(crate) async fn list(
    State(endpoint): State<Shared>,
) -> Result<Json<Vec<NodeImage>>, EndpointError> {
    let ctx = endpoint.ctx.clone();
    let listed = tokio::task::spawn_blocking(move || {
        let records = ctx
            .state
            .load_all()
            .map_err(|error| EndpointError::Internal(crate::chain(&error)))?;
        inventory(&ctx.runner.images, &records)
            .map_err(|error| EndpointError::Internal(crate::chain(&error)))
    })
    .await
    .map_err(|error| EndpointError::Internal(error.to_string()))??;
    Ok(Json(listed))
}

/// Every image in `images` with its size and the pods of `records` whose
/// containers use it. Blocking.
pub fn inventory(images: &ImageStore, records: &[PodRecord]) -> Result<Vec<NodeImage>, ImageError> {
    let mut listed = Vec::new();
    for stored in images.list()? {
        let users = users(&stored.reference, records);
        match images.resolve(&stored.reference) {
            Ok(image) => listed.push(summary(&image, users)),
            // An image whose manifest cannot be read is still listed.
            Err(_) => listed.push(NodeImage {
                reference: stored.reference,
                digest: stored.manifest_digest.to_string(),
                size: 0,
                pods: users,
            }),
        }
    }
    Ok(listed)
}

fn summary(image: &Image, pods: Vec<String>) -> NodeImage {
    NodeImage {
        reference: image.reference.to_string(),
        digest: image.manifest_digest.to_string(),
        size: image.layers.iter().map(|layer| layer.size).sum(),
        pods,
    }
}

/// The pods (`pod/web`, `pod/team-a/web`) with a container running `reference`
/// (`busybox` and `busybox:latest` are the same image).
fn users(reference: &str, records: &[PodRecord]) -> Vec<String> {
    let canonical = |name: &str| {
        name.parse::<Reference>()
            .map_or_else(|_| name.to_string(), |r| r.to_string())
    };
    let wanted = canonical(reference);
    records
        .iter()
        .filter(|record| {
            record.pod.typed_spec::<PodSpec>().is_ok_and(|spec| {
                spec.containers
                    .iter()
                    .any(|c| canonical(&c.image) == wanted)
            })
        })
        .map(|record| record.pod.key().to_string())
        .collect()
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::time::Duration;

    use axum::body::Body;
    use axum::http::{Request, StatusCode};
    use http_body_util::BodyExt;
    use tokio_util::sync::CancellationToken;
    use tower::ServiceExt;

    use super::*;
    use crate::steps::fake::FakeApi;

    /// The agent's endpoint on a fresh data dir under `dir`.
    fn endpoint(dir: &Path) -> axum::Router {
        let config = crate::AgentConfig {
            node: "node-1".into(),
            data_dir: dir.join("data"),
            address: None,
            image_revisions: 3,
            heartbeat: Duration::from_secs(5),
            endpoint: None,
            network: None,
            volume_plugin_dir: None,
            registries: crate::registries::RegistrySettings::default(),
        };
        let steps = Arc::new(FakeApi::new(crate::steps::fake::pod("start", &[])));
        let ctx = crate::context(&config, None, steps).expect("agent context");
        crate::serve::app(Arc::new(ctx), CancellationToken::new())
    }

    /// Sends `body` in chunks of 4 KiB; the status and the JSON answer.
    async fn send(
        app: &axum::Router,
        method: &str,
        uri: &str,
        body: Vec<u8>,
    ) -> (StatusCode, serde_json::Value) {
        let chunks: Vec<Result<Bytes, io::Error>> = body
            .chunks(4096)
            .map(|chunk| Ok(Bytes::copy_from_slice(chunk)))
            .collect();
        let request = Request::builder()
            .method(method)
            .uri(uri)
            .body(Body::from_stream(futures::stream::iter(chunks)))
            .unwrap();
        let response = app.clone().oneshot(request).await.unwrap();
        let status = response.status();
        let bytes = response.into_body().collect().await.unwrap().to_bytes();
        (status, serde_json::from_slice(&bytes).unwrap_or_default())
    }

    #[tokio::test]
    async fn an_upload_is_imported_into_the_nodes_store_and_listed() {
        corral_testkit::require_root();
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().join("root");
        std::fs::create_dir_all(root.join("bin")).unwrap();
        std::fs::write(root.join("bin/hello"), b"#!/bin/sh\necho hello\n").unwrap();
        let tar = dir.path().join("app.tar");
        corral_runtime::image::pack::pack_dir(&root, "local/app:1", &[], &tar).unwrap();
        let archive = std::fs::read(&tar).unwrap();
        let app = endpoint(dir.path());

        let (status, body) = send(
            &app,
            "POST",
            "/v1/images/import?name=Bad%20Name",
            archive.clone(),
        )
        .await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{body}");
        assert!(
            body["message"]
                .as_str()
                .unwrap()
                .starts_with("name: \"Bad Name\""),
            "{body}"
        );
        let (status, body) = send(&app, "POST", "/v1/images/import", b"junk".repeat(4000)).await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{body}");
        assert!(
            body["message"]
                .as_str()
                .unwrap()
                .starts_with("import failed, nothing was imported"),
            "{body}"
        );

        let (status, body) = send(
            &app,
            "POST",
            "/v1/images/import?name=local%2Frenamed%3A2",
            archive,
        )
        .await;
        assert_eq!(status, StatusCode::OK, "{body}");
        assert_eq!(body[0]["reference"], "local/renamed:2");
        assert!(body[0]["digest"].as_str().unwrap().starts_with("sha256:"));

        let (status, body) = send(&app, "GET", "/v1/images", Vec::new()).await;
        assert_eq!(status, StatusCode::OK, "{body}");
        let listed: Vec<&str> = body
            .as_array()
            .unwrap()
            .iter()
            .map(|image| image["reference"].as_str().unwrap())
            .collect();
        assert_eq!(
            listed,
            ["local/renamed:2"],
            "the junk and the refusals left nothing"
        );
        assert!(body[0]["size"].as_u64().unwrap() > 0, "{body}");
    }

    #[test]
    fn the_reader_hands_on_chunks_then_the_end_or_the_break() {
        let (sender, chunks) = mpsc::channel(4);
        sender.try_send(Ok(Bytes::from_static(b"hel"))).unwrap();
        sender.try_send(Ok(Bytes::from_static(b"lo"))).unwrap();
        drop(sender);
        let mut reader = ChannelReader {
            chunks,
            current: Bytes::new(),
        };
        let mut text = String::new();
        reader.read_to_string(&mut text).unwrap();
        assert_eq!(text, "hello");

        let (sender, chunks) = mpsc::channel(4);
        sender.try_send(Ok(Bytes::from_static(b"ab"))).unwrap();
        sender
            .try_send(Err(io::Error::other("the upload broke off")))
            .unwrap();
        let mut reader = ChannelReader {
            chunks,
            current: Bytes::new(),
        };
        let mut out = Vec::new();
        let error = reader.read_to_end(&mut out).unwrap_err();
        assert_eq!(error.to_string(), "the upload broke off");
        assert_eq!(out, b"ab");
    }
}
