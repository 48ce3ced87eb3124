//! Query-string parameters, with repeated keys (`author=a&author=b`).

use chrono::{DateTime, Utc};

use crate::error::ApiError;

/// Decoded query parameters in order.
#[derive(Debug, Clone, Default)]
pub struct Params(Vec<(String, String)>);

impl Params {
    pub fn parse(raw: Option<&str>) -> Self {
        Params(
            form_urlencoded::parse(raw.unwrap_or("").as_bytes())
                .map(|(k, v)| (k.into_owned(), v.into_owned()))
                .collect(),
        )
    }

    pub fn get(&self, key: &str) -> Option<&str> {
        self.0
            .iter()
            .rev()
            .find(|(k, _)| k == key)
            .map(|(_, v)| v.as_str())
    }

    /// Every value of a repeated key; comma-separated values are split too.
    pub fn all(&self, key: &str) -> Vec<String> {
        self.0
            .iter()
            .filter(|(k, _)| k == key)
            .flat_map(|(_, v)| v.split(','))
            .map(str::trim)
            .filter(|v| !v.is_empty())
            .map(str::to_string)
            .collect()
    }

    pub fn flag(&self, key: &str) -> bool {
        matches!(self.get(key), Some("true" | "1" | ""))
    }

    pub fn number(&self, key: &str) -> Result<Option<u64>, ApiError> {
        self.get(key)
            .filter(|v| !v.is_empty())
            .map(|v| {
                v.parse().map_err(|_| {
                    ApiError::BadRequest(format!(
                        "query parameter {key}: expected a whole number, got {v:?}"
                    ))
                })
            })
            .transpose()
    }

    /// A point in time given as RFC 3339 or as a duration before `now` (`1h`).
    pub fn since(&self, key: &str, now: DateTime<Utc>) -> Result<Option<DateTime<Utc>>, ApiError> {
        let Some(value) = self.get(key).filter(|v| !v.is_empty()) else {
            return Ok(None);
        };
        if let Ok(time) = DateTime::parse_from_rfc3339(value) {
            return Ok(Some(time.with_timezone(&Utc)));
        }
        let duration = humantime::parse_duration(value).map_err(|_| {
            ApiError::BadRequest(format!(
                "query parameter {key}: expected a duration like 1h or 30m, or an RFC 3339 time, got {value:?}"
            ))
        })?;
        let duration = chrono::Duration::from_std(duration).map_err(|_| {
            ApiError::BadRequest(format!("query parameter {key}: {value:?} is too long"))
        })?;
        Ok(Some(now - duration))
    }
}
