//! Image references: `[HOST[:PORT]/]name[:tag][@sha256:…]`, and where a
//! name without a host is pulled from (Docker Hub, like Docker; never for
//! the `local/` namespace).

use std::fmt;
use std::str::FromStr;

use super::digest::Digest;

/// Docker Hub's name in references.
pub const DOCKER_HUB: &str = "docker.io";

/// Names of Docker Hub seen in references and credential files.
pub const DOCKER_HUB_ALIASES: [&str; 3] = [DOCKER_HUB, "index.docker.io", "registry-1.docker.io"];

/// The namespace of images that exist only on nodes (never pulled).
pub const LOCAL_NAMESPACE: &str = "local";

/// A parsed image reference. Without a tag or digest the tag is `latest`.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Reference {
    /// `HOST[:PORT]` when the first path component looks like a host
    /// (contains `.` or `:`, or is `localhost`).
    pub registry: Option<String>,
    /// The repository path, e.g. `library/busybox`.
    pub repository: String,
    pub tag: Option<String>,
    pub digest: Option<Digest>,
}

/// Why a string is not an image reference.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum InvalidReference {
    #[error("image reference is empty")]
    Empty,
    #[error("image reference {0:?} has an invalid repository name")]
    Repository(String),
    #[error("image reference {0:?} has an invalid tag")]
    Tag(String),
    #[error("image reference {0:?} has an invalid digest")]
    Digest(String),
}

impl Reference {
    /// The tag or digest to ask a registry for.
    pub fn registry_reference(&self) -> String {
        match (&self.digest, &self.tag) {
            (Some(d), _) => d.to_string(),
            (None, Some(t)) => t.clone(),
            (None, None) => "latest".to_string(),
        }
    }

    /// Whether this names an image that is never pulled: no registry host
    /// and the `local/` namespace (imported or packed on the node).
    pub fn is_local_only(&self) -> bool {
        self.registry.is_none()
            && self
                .repository
                .split_once('/')
                .is_some_and(|(namespace, _)| namespace == LOCAL_NAMESPACE)
    }

    /// The name a pull fetches and stores, resolved like Docker resolves
    /// it: no host means Docker Hub (`busybox` is
    /// `docker.io/library/busybox`), and Docker Hub's other spellings
    /// (`index.docker.io`, `registry-1.docker.io`) are `docker.io`. `None`
    /// for a [local-only](Self::is_local_only) name.
    pub fn pull_name(&self) -> Option<Reference> {
        if self.is_local_only() {
            return None;
        }
        let hub = match self.registry.as_deref() {
            None => true,
            Some(host) => DOCKER_HUB_ALIASES.contains(&host),
        };
        if !hub {
            return Some(self.clone());
        }
        let repository = if self.repository.contains('/') {
            self.repository.clone()
        } else {
            format!("library/{}", self.repository)
        };
        Some(Reference {
            registry: Some(DOCKER_HUB.to_string()),
            repository,
            ..self.clone()
        })
    }

    /// The same reference without the registry host.
    pub fn without_registry(&self) -> Reference {
        Reference {
            registry: None,
            ..self.clone()
        }
    }
}

fn valid_component(c: &str) -> bool {
    !c.is_empty()
        && c.bytes().all(|b| {
            b.is_ascii_lowercase() || b.is_ascii_digit() || matches!(b, b'.' | b'_' | b'-')
        })
        && c.bytes().next().is_some_and(|b| b.is_ascii_alphanumeric())
}

fn valid_tag(t: &str) -> bool {
    !t.is_empty()
        && t.len() <= 128
        && t.bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'))
        && t.bytes()
            .next()
            .is_some_and(|b| b.is_ascii_alphanumeric() || b == b'_')
}

impl FromStr for Reference {
    type Err = InvalidReference;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        if s.is_empty() {
            return Err(InvalidReference::Empty);
        }
        let (rest, digest) = match s.split_once('@') {
            Some((rest, d)) => (
                rest,
                Some(
                    d.parse::<Digest>()
                        .map_err(|_| InvalidReference::Digest(s.to_string()))?,
                ),
            ),
            None => (s, None),
        };
        // A tag is after the last ':' that comes after the last '/'.
        let last_slash = rest.rfind('/').map_or(0, |i| i + 1);
        let (name, tag) = match rest[last_slash..].rfind(':') {
            Some(i) => {
                let at = last_slash + i;
                (&rest[..at], Some(rest[at + 1..].to_string()))
            }
            None => (rest, None),
        };
        if let Some(t) = &tag
            && !valid_tag(t)
        {
            return Err(InvalidReference::Tag(s.to_string()));
        }
        let (registry, repository) = match name.split_once('/') {
            Some((first, path))
                if first.contains('.') || first.contains(':') || first == "localhost" =>
            {
                (Some(first.to_string()), path)
            }
            _ => (None, name),
        };
        if !repository.split('/').all(valid_component) {
            return Err(InvalidReference::Repository(s.to_string()));
        }
        Ok(Reference {
            registry,
            repository: repository.to_string(),
            tag: if tag.is_none() && digest.is_none() {
                Some("latest".to_string())
            } else {
                tag
            },
            digest,
        })
    }
}

impl fmt::Display for Reference {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if let Some(r) = &self.registry {
            write!(f, "{r}/")?;
        }
        f.write_str(&self.repository)?;
        if let Some(t) = &self.tag {
            write!(f, ":{t}")?;
        }
        if let Some(d) = &self.digest {
            write!(f, "@{d}")?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(s: &str) -> Reference {
        s.parse().expect(s)
    }

    #[test]
    fn local_name_gets_latest() {
        let r = parse("busybox");
        assert_eq!(r.registry, None);
        assert_eq!(r.repository, "busybox");
        assert_eq!(r.tag.as_deref(), Some("latest"));
        assert_eq!(r.to_string(), "busybox:latest");
    }

    #[test]
    fn host_port_registry() {
        let r = parse("127.0.0.1:5000/corral/busybox:1");
        assert_eq!(r.registry.as_deref(), Some("127.0.0.1:5000"));
        assert_eq!(r.repository, "corral/busybox");
        assert_eq!(r.tag.as_deref(), Some("1"));
        assert_eq!(r.registry_reference(), "1");
        assert_eq!(r.to_string(), "127.0.0.1:5000/corral/busybox:1");
    }

    #[test]
    fn first_component_without_dot_is_a_path() {
        let r = parse("local/busybox:1");
        assert_eq!(r.registry, None);
        assert_eq!(r.repository, "local/busybox");
        let r = parse("localhost/probe:1");
        assert_eq!(r.registry.as_deref(), Some("localhost"));
    }

    #[test]
    fn digest_reference() {
        let d = Digest::of(b"x");
        let r = parse(&format!("reg.example:5000/a@{d}"));
        assert_eq!(r.tag, None);
        assert_eq!(r.digest, Some(d.clone()));
        assert_eq!(r.registry_reference(), d.to_string());
    }

    fn pull_name(s: &str) -> Option<String> {
        parse(s).pull_name().map(|r| r.to_string())
    }

    #[test]
    fn short_names_are_pulled_from_docker_hub() {
        let hub = |s: &str| Some(s.to_string());
        assert_eq!(
            pull_name("busybox"),
            hub("docker.io/library/busybox:latest")
        );
        assert_eq!(pull_name("nginx:1.27"), hub("docker.io/library/nginx:1.27"));
        assert_eq!(
            pull_name("library/busybox"),
            hub("docker.io/library/busybox:latest")
        );
        assert_eq!(
            pull_name("bitnami/redis:7"),
            hub("docker.io/bitnami/redis:7")
        );
        assert_eq!(
            pull_name("docker.io/busybox"),
            hub("docker.io/library/busybox:latest")
        );
        assert_eq!(
            pull_name("index.docker.io/library/busybox:1"),
            hub("docker.io/library/busybox:1")
        );
        let d = Digest::of(b"x");
        assert_eq!(
            pull_name(&format!("busybox@{d}")),
            Some(format!("docker.io/library/busybox@{d}"))
        );
    }

    #[test]
    fn local_namespace_is_never_pulled_and_hosts_stay() {
        assert_eq!(pull_name("local/busybox:1"), None);
        assert!(parse("local/busybox:1").is_local_only());
        assert!(!parse("localbox:1").is_local_only());
        assert!(!parse("reg.example:5000/local/busybox:1").is_local_only());
        assert_eq!(
            pull_name("127.0.0.1:5000/corral/busybox:1"),
            Some("127.0.0.1:5000/corral/busybox:1".to_string())
        );
        assert_eq!(
            pull_name("ghcr.io/owner/app:2"),
            Some("ghcr.io/owner/app:2".to_string())
        );
    }

    #[test]
    fn rejects_bad_references() {
        assert_eq!("".parse::<Reference>(), Err(InvalidReference::Empty));
        assert!(matches!(
            "Upper/case".parse::<Reference>(),
            Err(InvalidReference::Repository(_))
        ));
        assert!(matches!(
            "a:b/c".parse::<Reference>().map(|r| r.registry),
            Ok(Some(_))
        ));
        assert!(matches!(
            "name:bad tag".parse::<Reference>(),
            Err(InvalidReference::Tag(_))
        ));
        assert!(matches!(
            "name@sha256:zz".parse::<Reference>(),
            Err(InvalidReference::Digest(_))
        ));
    }
}
