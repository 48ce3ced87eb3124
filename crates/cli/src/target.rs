//! Naming objects on the command line: `pod/web`, `pods`, `pod web`.

use anyhow::{Context, bail};
use corral_api::{Kind, ObjectKey};

/// What a command names: a kind, and maybe one object of it.
#[derive(Debug, Clone)]
pub struct Target {
    pub kind: Kind,
    pub name: Option<String>,
}

impl Target {
    /// Parses `KIND`, `KIND/NAME`, or `KIND` followed by a separate `NAME`.
    pub fn parse(first: &str, second: Option<&str>) -> anyhow::Result<Self> {
        let (kind, name) = match first.split_once('/') {
            Some((kind, name)) => {
                if second.is_some() {
                    bail!("give either KIND/NAME or KIND NAME, not both");
                }
                (kind, Some(name.to_string()))
            }
            None => (first, second.map(str::to_string)),
        };
        let kind: Kind = kind.parse()?;
        if name.as_deref() == Some("") {
            bail!("{first}: the name after the slash is empty");
        }
        Ok(Target { kind, name })
    }

    /// The key of the named object; an error if no name was given.
    pub fn key(&self, namespace: Option<&str>) -> anyhow::Result<ObjectKey> {
        let name = self.name.as_deref().with_context(|| {
            format!(
                "name which {}: write {}/NAME",
                self.kind.short(),
                self.kind.short()
            )
        })?;
        Ok(ObjectKey::new(self.kind, namespace, name))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn targets_parse_in_every_spelling() {
        let t = Target::parse("pod/web", None).unwrap();
        assert_eq!((t.kind, t.name.as_deref()), (Kind::Pod, Some("web")));
        let t = Target::parse("pods", None).unwrap();
        assert_eq!((t.kind, t.name), (Kind::Pod, None));
        let t = Target::parse("pd", Some("web")).unwrap();
        assert_eq!(
            (t.kind, t.name.as_deref()),
            (Kind::PinnedDeployment, Some("web"))
        );
        assert!(Target::parse("pod/", None).is_err());
        assert!(Target::parse("blob/x", None).is_err());
        assert!(Target::parse("pod/a", Some("b")).is_err());
        assert_eq!(
            Target::parse("node/n1", None)
                .unwrap()
                .key(Some("x"))
                .unwrap()
                .namespace,
            ""
        );
    }
}
