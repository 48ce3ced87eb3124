//! Resource quantities: CPU in millicores (`100m`, `2`) and memory in bytes
//! (`64Mi`, `1Gi`, `512M`, `1000`).

use std::fmt;
use std::str::FromStr;

use schemars::JsonSchema;
use serde::{Deserialize, Deserializer, Serialize, Serializer};

/// A quantity string that does not parse.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid {what} quantity {given:?}: expected {expected}")]
pub struct QuantityError {
    pub what: &'static str,
    pub given: String,
    pub expected: &'static str,
}

/// CPU in thousandths of a core.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, PartialOrd, Ord, Hash, JsonSchema)]
#[schemars(with = "String")]
pub struct Cpu {
    pub millis: u64,
}

impl FromStr for Cpu {
    type Err = QuantityError;

    fn from_str(given: &str) -> Result<Self, Self::Err> {
        let error = || QuantityError {
            what: "cpu",
            given: given.to_string(),
            expected: "millicores like 100m or cores like 2 or 0.5",
        };
        let text = given.trim();
        if let Some(millis) = text.strip_suffix('m') {
            return millis
                .parse()
                .map(|millis| Cpu { millis })
                .map_err(|_| error());
        }
        let cores: f64 = text.parse().map_err(|_| error())?;
        if !(cores.is_finite() && cores >= 0.0) {
            return Err(error());
        }
        Ok(Cpu {
            millis: (cores * 1000.0).round() as u64,
        })
    }
}

impl fmt::Display for Cpu {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.millis.is_multiple_of(1000) {
            write!(f, "{}", self.millis / 1000)
        } else {
            write!(f, "{}m", self.millis)
        }
    }
}

/// Memory in bytes.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, PartialOrd, Ord, Hash, JsonSchema)]
#[schemars(with = "String")]
pub struct Memory {
    pub bytes: u64,
}

const MEMORY_SUFFIXES: [(&str, u64); 8] = [
    ("Ki", 1 << 10),
    ("Mi", 1 << 20),
    ("Gi", 1 << 30),
    ("Ti", 1 << 40),
    ("k", 1_000),
    ("M", 1_000_000),
    ("G", 1_000_000_000),
    ("T", 1_000_000_000_000),
];

impl FromStr for Memory {
    type Err = QuantityError;

    fn from_str(given: &str) -> Result<Self, Self::Err> {
        let error = || QuantityError {
            what: "memory",
            given: given.to_string(),
            expected: "bytes with an optional suffix Ki, Mi, Gi, Ti, k, M, G or T, like 64Mi",
        };
        let text = given.trim();
        let (number, multiplier) = MEMORY_SUFFIXES
            .iter()
            .find_map(|(suffix, multiplier)| {
                text.strip_suffix(suffix)
                    .map(|number| (number, *multiplier))
            })
            .unwrap_or((text, 1));
        let number: u64 = number.parse().map_err(|_| error())?;
        number
            .checked_mul(multiplier)
            .map(|bytes| Memory { bytes })
            .ok_or_else(error)
    }
}

impl fmt::Display for Memory {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (suffix, multiplier) in MEMORY_SUFFIXES.iter().take(4).rev() {
            if self.bytes >= *multiplier && self.bytes.is_multiple_of(*multiplier) {
                return write!(f, "{}{}", self.bytes / multiplier, suffix);
            }
        }
        write!(f, "{}", self.bytes)
    }
}

macro_rules! string_serde {
    ($type:ty) => {
        impl Serialize for $type {
            fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
                serializer.collect_str(self)
            }
        }

        impl<'de> Deserialize<'de> for $type {
            fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
                #[derive(Deserialize)]
                #[serde(untagged)]
                enum Raw {
                    Text(String),
                    Number(f64),
                }
                let text = match Raw::deserialize(deserializer)? {
                    Raw::Text(text) => text,
                    Raw::Number(number) => number.to_string(),
                };
                text.parse().map_err(serde::de::Error::custom)
            }
        }
    };
}

string_serde!(Cpu);
string_serde!(Memory);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cpu_parses_millicores_and_cores() {
        assert_eq!("100m".parse::<Cpu>().unwrap().millis, 100);
        assert_eq!("2".parse::<Cpu>().unwrap().millis, 2000);
        assert_eq!("0.5".parse::<Cpu>().unwrap().millis, 500);
        assert!("lots".parse::<Cpu>().is_err());
        assert!("-1".parse::<Cpu>().is_err());
        assert_eq!(Cpu { millis: 1500 }.to_string(), "1500m");
        assert_eq!(Cpu { millis: 2000 }.to_string(), "2");
    }

    #[test]
    fn memory_parses_binary_and_decimal_suffixes() {
        assert_eq!("64Mi".parse::<Memory>().unwrap().bytes, 64 << 20);
        assert_eq!("1G".parse::<Memory>().unwrap().bytes, 1_000_000_000);
        assert_eq!("1000".parse::<Memory>().unwrap().bytes, 1000);
        assert!("64MB".parse::<Memory>().is_err());
        assert_eq!(Memory { bytes: 64 << 20 }.to_string(), "64Mi");
        let error = "x".parse::<Memory>().unwrap_err().to_string();
        assert!(error.contains("like 64Mi"), "{error}");
    }
}
