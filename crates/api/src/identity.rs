//! Who wrote: identities, their role and their author class.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// Whether a change came from a person or from a controller. History filters
/// (`--external`, `--system`) select on it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum AuthorClass {
    /// A person: an operator or a user.
    External,
    /// A controller or a node agent acting on its own.
    System,
}

impl AuthorClass {
    pub fn as_str(self) -> &'static str {
        match self {
            AuthorClass::External => "external",
            AuthorClass::System => "system",
        }
    }
}

/// What an identity may do; authorization rules key on it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum Role {
    /// A person with every right, including policies and tokens.
    Operator,
    /// A person limited to namespaced objects.
    User,
    /// A controller: writes only the fields it owns.
    Controller,
    /// A node agent: its own Node and the pods bound to it.
    Node,
    /// A join token: may only exchange itself for a node's own identity
    /// (`POST /v1/join`), until it expires.
    Joiner,
}

impl Role {
    /// People are external authors; controllers and nodes are system authors.
    pub fn author_class(self) -> AuthorClass {
        match self {
            Role::Operator | Role::User => AuthorClass::External,
            Role::Controller | Role::Node | Role::Joiner => AuthorClass::System,
        }
    }
}

/// An authenticated caller.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize, JsonSchema)]
pub struct Identity {
    pub name: String,
    pub role: Role,
    /// For users: the namespaces they may act in (`*`: every one); a user
    /// with none may read only cluster-wide objects. Unused for others.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub namespaces: Vec<String>,
    /// When the token stops working (join tokens); never when unset.
    #[serde(default, rename = "expiresAt", skip_serializing_if = "Option::is_none")]
    pub expires_at: Option<chrono::DateTime<chrono::Utc>>,
    /// For users: whether they may read Secrets' values (`corral get
    /// secret/x --reveal`) in their namespaces. Operators always may.
    #[serde(
        default,
        rename = "readSecrets",
        skip_serializing_if = "std::ops::Not::not"
    )]
    pub read_secrets: bool,
}

impl Identity {
    pub fn new(name: impl Into<String>, role: Role) -> Self {
        Identity {
            name: name.into(),
            role,
            namespaces: Vec::new(),
            expires_at: None,
            read_secrets: false,
        }
    }

    /// The identity, valid until `expires_at`.
    pub fn expiring(mut self, expires_at: chrono::DateTime<chrono::Utc>) -> Self {
        self.expires_at = Some(expires_at);
        self
    }

    /// The identity limited to (for users) `namespaces`.
    pub fn with_namespaces(mut self, namespaces: Vec<String>) -> Self {
        self.namespaces = namespaces;
        self
    }

    /// The identity with (for users) the right to read Secrets' values.
    pub fn reading_secrets(mut self, read_secrets: bool) -> Self {
        self.read_secrets = read_secrets;
        self
    }

    pub fn class(&self) -> AuthorClass {
        self.role.author_class()
    }
}

/// A token as `GET /v1/tokens` lists it: never the token, nor its hash.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct TokenInfo {
    /// The first 12 hex digits of the token's SHA-256: enough to name it
    /// in `corral token revoke`.
    pub id: String,
    pub identity: Identity,
    pub created_at: chrono::DateTime<chrono::Utc>,
    /// To within five minutes; absent if it was never used.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_used_at: Option<chrono::DateTime<chrono::Utc>>,
}

/// What a revocation removed.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct Revoked {
    pub revoked: Vec<TokenInfo>,
}
