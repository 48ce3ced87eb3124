//! Manifest parsing: YAML (several `---` documents) or JSON (one object or an
//! array), each document a `kind:`-discriminated object, checked against the
//! kind's schema with errors that name the field path or the line.

use std::fmt;

use serde::Deserialize;
use serde_json::Value;

use crate::meta::Kind;
use crate::object::Object;
use crate::validate::{FieldError, validate_object};

/// Why a manifest was refused. Nothing of a refused manifest is applied.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub struct ManifestError {
    /// 1-based index of the offending document.
    pub document: usize,
    /// `pod/web` when the document got far enough to name itself.
    pub object: Option<String>,
    /// 1-based line of a syntax error.
    pub line: Option<usize>,
    pub errors: Vec<FieldError>,
}

impl fmt::Display for ManifestError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "document {}", self.document)?;
        if let Some(object) = &self.object {
            write!(f, " ({object})")?;
        }
        if let Some(line) = self.line {
            write!(f, ", line {line}")?;
        }
        let messages: Vec<String> = self.errors.iter().map(ToString::to_string).collect();
        write!(f, ": {}", messages.join("; "))
    }
}

/// Parses every document of a manifest; the first bad document fails the
/// whole manifest.
pub fn parse_manifests(text: &str) -> Result<Vec<Object>, ManifestError> {
    let documents = split_documents(text)?;
    let mut objects = Vec::with_capacity(documents.len());
    for (index, document) in documents.into_iter().enumerate() {
        objects.push(parse_document(index + 1, document)?);
    }
    if objects.is_empty() {
        return Err(ManifestError {
            document: 1,
            object: None,
            line: None,
            errors: vec![FieldError::new("", "the manifest holds no object")],
        });
    }
    Ok(objects)
}

fn syntax_error(document: usize, line: Option<usize>, message: String) -> ManifestError {
    ManifestError {
        document,
        object: None,
        line,
        errors: vec![FieldError::new("", message)],
    }
}

fn split_documents(text: &str) -> Result<Vec<Value>, ManifestError> {
    let trimmed = text.trim_start();
    if trimmed.starts_with('{') || trimmed.starts_with('[') {
        let value: Value = serde_json::from_str(text)
            .map_err(|e| syntax_error(1, Some(e.line()), format!("invalid JSON: {e}")))?;
        return Ok(match value {
            Value::Array(items) => items,
            other => vec![other],
        });
    }
    let mut documents = Vec::new();
    for (index, document) in serde_yaml_ng::Deserializer::from_str(text).enumerate() {
        let value = Value::deserialize(document).map_err(|e| {
            let line = e.location().map(|l| l.line());
            syntax_error(index + 1, line, format!("invalid YAML: {e}"))
        })?;
        if !value.is_null() {
            documents.push(value);
        }
    }
    Ok(documents)
}

fn parse_document(document: usize, mut value: Value) -> Result<Object, ManifestError> {
    let refuse = |object: Option<String>, errors: Vec<FieldError>| ManifestError {
        document,
        object,
        line: None,
        errors,
    };
    let Some(map) = value.as_object() else {
        return Err(refuse(
            None,
            vec![FieldError::new(
                "",
                "expected a mapping with kind, metadata and spec",
            )],
        ));
    };
    let name = map
        .get("metadata")
        .and_then(|m| m.get("name"))
        .and_then(Value::as_str)
        .map(str::to_string);
    let kind = match map.get("kind") {
        None => return Err(refuse(None, vec![FieldError::new("kind", "is required")])),
        Some(Value::String(kind)) => kind
            .parse::<Kind>()
            .map_err(|e| refuse(None, vec![FieldError::new("kind", e.to_string())]))?,
        Some(_) => {
            return Err(refuse(
                None,
                vec![FieldError::new("kind", "must be a string")],
            ));
        }
    };
    let label = name.as_ref().map(|name| format!("{}/{name}", kind.short()));
    // `kind: pod`, `kind: PD`: any name `corral get` accepts, stored canonical.
    value["kind"] = Value::String(kind.as_str().to_string());
    let object = decode_object(value).map_err(|e| refuse(label.clone(), vec![e]))?;
    validate_object(&object).map_err(|errors| refuse(label, errors))?;
    Ok(object)
}

/// Decodes an object envelope, naming the path of the first field that does
/// not fit.
pub fn decode_object(value: Value) -> Result<Object, FieldError> {
    serde_path_to_error::deserialize::<_, Object>(value).map_err(|e| {
        let path = e.path().to_string();
        let path = if path == "." { String::new() } else { path };
        FieldError::new(path, e.into_inner().to_string())
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn error_of(text: &str) -> String {
        parse_manifests(text).unwrap_err().to_string()
    }

    #[test]
    fn yaml_with_several_documents_parses_in_order() {
        let objects = parse_manifests(
            "kind: Pod\nmetadata: {name: web}\nspec: {containers: [{name: web, image: busybox}]}\n---\nkind: Node\nmetadata: {name: node-1}\nspec: {}\n",
        )
        .unwrap();
        assert_eq!(objects.len(), 2);
        assert_eq!(objects[0].kind, Kind::Pod);
        assert_eq!(objects[0].key().namespace, "default");
        assert_eq!(objects[1].kind, Kind::Node);
    }

    #[test]
    fn kinds_are_accepted_by_any_name_in_any_case() {
        let objects = parse_manifests(
            "kind: pod\nmetadata: {name: web}\nspec: {containers: [{name: web, image: b}]}\n---\nkind: NODES\nmetadata: {name: node-1}\nspec: {}\n---\nkind: po\nmetadata: {name: short}\nspec: {containers: [{name: web, image: b}]}\n",
        )
        .unwrap();
        let kinds: Vec<Kind> = objects.iter().map(|o| o.kind).collect();
        assert_eq!(kinds, [Kind::Pod, Kind::Node, Kind::Pod]);
        let json = serde_json::to_value(&objects[0]).unwrap();
        assert_eq!(json["kind"], "Pod", "stored by its canonical name");
    }

    #[test]
    fn json_object_and_array_parse() {
        let one = r#"{"kind":"Pod","metadata":{"name":"a"},"spec":{"containers":[{"name":"c","image":"i"}]}}"#;
        assert_eq!(parse_manifests(one).unwrap().len(), 1);
        assert_eq!(parse_manifests(&format!("[{one},{one}]")).unwrap().len(), 2);
    }

    #[test]
    fn errors_name_the_field_path() {
        let error = error_of(
            "kind: Pod\nmetadata: {name: web}\nspec: {containers: [{name: web, image: ''}]}\n",
        );
        assert!(
            error.contains("spec.containers[0].image: must not be empty"),
            "{error}"
        );

        let error = error_of(
            "kind: Pod\nmetadata: {name: web}\nspec: {containers: [{name: web, image: b, imagee: c}]}\n",
        );
        assert!(error.contains("spec.containers[0]"), "{error}");
        assert!(error.contains("unknown field `imagee`"), "{error}");

        let error = error_of(
            "kind: Pod\nmetadata: {name: web}\nspec: {containers: [{name: web, image: b, ports: [http]}]}\n",
        );
        assert!(error.contains("spec.containers[0].ports[0]"), "{error}");

        let error = error_of(
            "kind: Pod\nmetadata: {labels: {a: b}}\nspec: {containers: [{name: web, image: b}]}\n",
        );
        assert!(error.contains("metadata.name: is required"), "{error}");

        let error = error_of("kind: Blob\nmetadata: {name: x}\n");
        assert!(error.contains("kind: unknown kind \"Blob\""), "{error}");

        let error = error_of("kind: Pod\nmetadata: {name: web\nspec: [\n");
        assert!(error.contains("invalid YAML"), "{error}");
        assert!(error.contains("line"), "{error}");
    }

    #[test]
    fn second_document_errors_say_which_document() {
        let error = error_of(
            "kind: Node\nmetadata: {name: n}\n---\nkind: Pod\nmetadata: {name: web}\nspec: {}\n",
        );
        assert!(error.starts_with("document 2 (pod/web)"), "{error}");
        assert!(error.contains("spec"), "{error}");
    }
}
