//! The rules of a Secret's and a Config's data: key names, base64, the
//! size limit, and values never quoted.

use super::Checker;
use crate::kinds::{MAX_DATA_BYTES, SecretSpec, is_data_key};

pub(super) fn check_secret(checker: &mut Checker, spec: &SecretSpec) {
    use base64::Engine;
    check_data_keys(checker, "spec.data", spec.data.keys());
    check_data_keys(checker, "spec.stringData", spec.string_data.keys());
    check_data_keys(checker, "spec.keys", spec.keys.keys());
    if let Some(kind) = &spec.secret_type {
        checker.non_empty("spec.type", kind);
    }
    let mut size = 0;
    for (key, value) in &spec.data {
        match base64::engine::general_purpose::STANDARD.decode(value) {
            Ok(bytes) => size += bytes.len(),
            Err(_) => checker.fail(
                format!("spec.data.{key}"),
                "is not valid base64 (put text in stringData instead); the value is not shown",
            ),
        }
        if spec.string_data.contains_key(key) {
            checker.fail(
                format!("spec.stringData.{key}"),
                "is also in spec.data: give each key once",
            );
        }
    }
    size += spec.string_data.values().map(String::len).sum::<usize>();
    check_data_size(checker, size);
    if spec.has_values() && !spec.keys.is_empty() {
        checker.fail(
            "spec.keys",
            "is the server's record of stored values: give values in data or stringData, without keys",
        );
    }
}

pub(super) fn check_data_keys<'a>(
    checker: &mut Checker,
    path: &str,
    keys: impl Iterator<Item = &'a String>,
) {
    for key in keys {
        if !is_data_key(key) {
            checker.fail(
                format!("{path}.{key}"),
                "is not a valid key: letters, digits, '-', '_' and '.' only (it becomes a file name), at most 253, not '.' or '..'",
            );
        }
    }
}

pub(super) fn check_data_size(checker: &mut Checker, size: usize) {
    if size > MAX_DATA_BYTES {
        checker.fail(
            "spec",
            format!("holds {size} bytes of data; the limit is {MAX_DATA_BYTES} (1 MiB)"),
        );
    }
}
