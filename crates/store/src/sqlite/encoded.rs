//! An object's JSON in parts: its spec and status encoded before its write
//! is queued (design 0056).

use corral_api::Object;

use super::schema::corrupt_json;
use crate::StoreError;

/// An object's spec and status as JSON, encoded on the caller's thread
/// before its write is queued, so that the writer thread (which every
/// write of the store waits for in turn) only encodes the metadata it sets
/// and joins the three. The writer never changes a spec or a status.
#[derive(Debug)]
pub(crate) struct EncodedParts {
    /// The spec's bytes: what history stores and the spec cache keeps
    /// (the serializer sorts object keys, so equal specs have equal bytes).
    spec: String,
    /// `None` for a null status, which an object's JSON leaves out.
    status: Option<String>,
}

impl EncodedParts {
    pub(crate) fn of(object: &Object) -> Result<EncodedParts, StoreError> {
        let spec = serde_json::to_string(&object.spec).map_err(corrupt_json("spec"))?;
        let status = if object.status.is_null() {
            None
        } else {
            Some(serde_json::to_string(&object.status).map_err(corrupt_json("status"))?)
        };
        Ok(EncodedParts { spec, status })
    }

    /// The spec's JSON.
    pub(crate) fn spec(&self) -> &[u8] {
        self.spec.as_bytes()
    }

    /// The spec's JSON, given away (to history and the spec cache).
    pub(crate) fn into_spec(self) -> Vec<u8> {
        self.spec.into_bytes()
    }

    /// `object` as JSON, byte for byte what `serde_json::to_string(object)`
    /// writes (`kind`, `metadata`, `spec`, then `status` unless null), with
    /// these parts as its spec and status.
    pub(crate) fn body(&self, object: &Object) -> Result<String, StoreError> {
        let kind = serde_json::to_string(&object.kind).map_err(corrupt_json("object"))?;
        let metadata = serde_json::to_string(&object.metadata).map_err(corrupt_json("object"))?;
        let status_len = self.status.as_ref().map_or(0, String::len);
        let mut body =
            String::with_capacity(kind.len() + metadata.len() + self.spec.len() + status_len + 40);
        body.push_str("{\"kind\":");
        body.push_str(&kind);
        body.push_str(",\"metadata\":");
        body.push_str(&metadata);
        body.push_str(",\"spec\":");
        body.push_str(&self.spec);
        if let Some(status) = &self.status {
            body.push_str(",\"status\":");
            body.push_str(status);
        }
        body.push('}');
        Ok(body)
    }
}

#[cfg(test)]
mod tests {
    use corral_api::{Kind, Object, OwnerReference};
    use serde_json::{Value, json};

    use super::EncodedParts;

    /// The joined parts are what serde writes for the whole object, with
    /// and without a status, a namespace, labels and an owner.
    #[test]
    fn the_body_is_the_objects_own_json() {
        let mut pod = Object::new(
            Kind::Pod,
            Some("team-a"),
            "web",
            json!({"containers": [{"name": "app", "image": "busybox", "env": {"A": "\"quoted\" é"}}]}),
        );
        pod.metadata.uid = "uid-1".into();
        pod.metadata.revision = 7;
        pod.metadata.resource_version = 42;
        pod.metadata.labels.insert("app".into(), "web".into());
        pod.metadata.owner = Some(OwnerReference {
            kind: Kind::PinnedDeployment,
            name: "web".into(),
            uid: "uid-0".into(),
        });
        let mut placed = pod.clone();
        placed.status = json!({"node": "n1", "workflow": {"instances": []}});
        let mut cluster_wide = Object::new(Kind::Node, None, "n1", Value::Null);
        cluster_wide.status = json!({});
        for object in [pod, placed, cluster_wide] {
            let parts = EncodedParts::of(&object).expect("parts");
            let body = parts.body(&object).expect("body");
            assert_eq!(body, serde_json::to_string(&object).expect("json"));
            let decoded: Object = serde_json::from_str(&body).expect("decodes");
            assert_eq!(decoded, object);
        }
    }
}
