//! Label selectors: `app=web,tier!=db,canary,!legacy`.

use std::collections::BTreeMap;
use std::fmt;
use std::str::FromStr;

/// A selector string that does not parse.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "invalid label selector {given:?} at {term:?}: expected key=value, key!=value, key or !key, separated by commas"
)]
pub struct SelectorError {
    pub given: String,
    pub term: String,
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum Requirement {
    Equals(String, String),
    NotEquals(String, String),
    Exists(String),
    Absent(String),
}

/// A conjunction of label requirements. The empty selector matches everything.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct LabelSelector {
    requirements: Vec<Requirement>,
}

impl LabelSelector {
    /// A selector matching exactly these labels (as a PinnedDeployment's
    /// `selector` map does).
    pub fn from_map(labels: &BTreeMap<String, String>) -> Self {
        LabelSelector {
            requirements: labels
                .iter()
                .map(|(k, v)| Requirement::Equals(k.clone(), v.clone()))
                .collect(),
        }
    }

    pub fn is_empty(&self) -> bool {
        self.requirements.is_empty()
    }

    pub fn matches(&self, labels: &BTreeMap<String, String>) -> bool {
        self.requirements
            .iter()
            .all(|requirement| match requirement {
                Requirement::Equals(k, v) => labels.get(k) == Some(v),
                Requirement::NotEquals(k, v) => labels.get(k) != Some(v),
                Requirement::Exists(k) => labels.contains_key(k),
                Requirement::Absent(k) => !labels.contains_key(k),
            })
    }
}

fn valid_key(key: &str) -> bool {
    !key.is_empty()
        && key
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.' | '/'))
}

impl FromStr for LabelSelector {
    type Err = SelectorError;

    fn from_str(given: &str) -> Result<Self, Self::Err> {
        let mut requirements = Vec::new();
        for term in given.split(',').map(str::trim).filter(|t| !t.is_empty()) {
            let error = || SelectorError {
                given: given.to_string(),
                term: term.to_string(),
            };
            let requirement = if let Some((key, value)) = term.split_once("!=") {
                Requirement::NotEquals(key.trim().to_string(), value.trim().to_string())
            } else if let Some((key, value)) =
                term.split_once("==").or_else(|| term.split_once('='))
            {
                Requirement::Equals(key.trim().to_string(), value.trim().to_string())
            } else if let Some(key) = term.strip_prefix('!') {
                Requirement::Absent(key.trim().to_string())
            } else {
                Requirement::Exists(term.to_string())
            };
            let key = match &requirement {
                Requirement::Equals(k, _)
                | Requirement::NotEquals(k, _)
                | Requirement::Exists(k)
                | Requirement::Absent(k) => k,
            };
            if !valid_key(key) {
                return Err(error());
            }
            requirements.push(requirement);
        }
        Ok(LabelSelector { requirements })
    }
}

impl fmt::Display for LabelSelector {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let terms: Vec<String> = self
            .requirements
            .iter()
            .map(|requirement| match requirement {
                Requirement::Equals(k, v) => format!("{k}={v}"),
                Requirement::NotEquals(k, v) => format!("{k}!={v}"),
                Requirement::Exists(k) => k.clone(),
                Requirement::Absent(k) => format!("!{k}"),
            })
            .collect();
        f.write_str(&terms.join(","))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn labels(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn selector_terms_combine_as_and() {
        let selector: LabelSelector = "app=web,tier!=db,canary,!legacy".parse().unwrap();
        assert!(selector.matches(&labels(&[("app", "web"), ("canary", "")])));
        assert!(!selector.matches(&labels(&[("app", "web")])));
        assert!(!selector.matches(&labels(&[("app", "web"), ("canary", ""), ("tier", "db")])));
        assert!(!selector.matches(&labels(&[("app", "web"), ("canary", ""), ("legacy", "1")])));
        assert_eq!(selector.to_string(), "app=web,tier!=db,canary,!legacy");
    }

    #[test]
    fn empty_selector_matches_everything_and_bad_terms_are_named() {
        assert!(LabelSelector::default().matches(&labels(&[("a", "b")])));
        let error = "app=web,=x".parse::<LabelSelector>().unwrap_err();
        assert_eq!(error.term, "=x");
    }
}
