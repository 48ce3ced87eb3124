//! IPv4 egress: one corral-owned nftables table (`ip corral`) that
//! masquerades the node-local pod range out of the node's uplink.
//!
//! The ruleset text is generated purely and applied with `nft -f -` (there is
//! no maintained Rust nftables-over-netlink crate). Each apply deletes and
//! recreates the table in one nft transaction, so it is idempotent and never
//! leaves a half-written table; nothing outside the `corral` table is touched.

use std::path::{Path, PathBuf};
use std::process::Command;

use crate::ipam::EgressRange;
use crate::netns::{self, NetnsError};

/// The nftables family and name of corral's table.
pub const TABLE: &str = "ip corral";

/// Why egress could not be applied or removed.
#[derive(Debug, thiserror::Error)]
pub enum EgressError {
    #[error(
        "uplink interface name {name:?} is invalid: expected 1 to 15 letters, digits, '.', '_' or '-'"
    )]
    InterfaceName { name: String },
    #[error(transparent)]
    Netns(#[from] NetnsError),
    #[error("run nft{}", in_netns(.netns))]
    Spawn {
        netns: Option<PathBuf>,
        #[source]
        source: std::io::Error,
    },
    #[error("nft refused the ruleset{}: {stderr}", in_netns(.netns))]
    Refused {
        netns: Option<PathBuf>,
        stderr: String,
    },
}

fn in_netns(netns: &Option<PathBuf>) -> String {
    netns
        .as_ref()
        .map(|p| format!(" in network namespace {}", p.display()))
        .unwrap_or_default()
}

/// The node's egress settings (node-local, never in the API).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EgressConfig {
    /// The pod IPv4 range to masquerade.
    pub range: EgressRange,
    /// The interface IPv4 traffic leaves the node through.
    pub uplink: String,
}

fn validate_uplink(name: &str) -> Result<(), EgressError> {
    if crate::datapath::is_interface_name(name) {
        Ok(())
    } else {
        Err(EgressError::InterfaceName {
            name: name.to_string(),
        })
    }
}

/// Ruleset text that drops corral's table whether or not it exists.
pub fn removal_ruleset() -> String {
    // `add` then `delete` in one transaction: deleting never fails on absence.
    format!("add table {TABLE}\ndelete table {TABLE}\n")
}

/// Ruleset text that (re)creates corral's table with the masquerade rule.
pub fn ruleset(config: &EgressConfig) -> Result<String, EgressError> {
    validate_uplink(&config.uplink)?;
    Ok(format!(
        "{removal}table {TABLE} {{\n\
         \tchain postrouting {{\n\
         \t\ttype nat hook postrouting priority srcnat; policy accept;\n\
         \t\tip saddr {range} oifname \"{uplink}\" masquerade\n\
         \t}}\n\
         }}\n",
        removal = removal_ruleset(),
        range = config.range.net(),
        uplink = config.uplink,
    ))
}

fn nft(netns: Option<&Path>, args: &[&str], stdin: Option<&str>) -> Result<String, EgressError> {
    let mut command = Command::new("nft");
    command.args(args);
    let output = netns::output_with_input(netns, &mut command, stdin.map(str::as_bytes))?.map_err(
        |source| EgressError::Spawn {
            netns: netns.map(Path::to_path_buf),
            source,
        },
    )?;
    if !output.status.success() {
        return Err(EgressError::Refused {
            netns: netns.map(Path::to_path_buf),
            stderr: String::from_utf8_lossy(&output.stderr).trim().to_string(),
        });
    }
    Ok(String::from_utf8_lossy(&output.stdout).into_owned())
}

/// Installs (or replaces) the masquerade in `netns` (or here for `None`).
pub fn apply(netns: Option<&Path>, config: &EgressConfig) -> Result<(), EgressError> {
    nft(netns, &["-f", "-"], Some(&ruleset(config)?)).map(drop)
}

/// Removes corral's table; absent is fine.
pub fn remove(netns: Option<&Path>) -> Result<(), EgressError> {
    nft(netns, &["-f", "-"], Some(&removal_ruleset())).map(drop)
}

/// Corral's table as nft lists it, or `None` when it does not exist.
pub fn current(netns: Option<&Path>) -> Result<Option<String>, EgressError> {
    let tables = nft(netns, &["list", "tables", "ip"], None)?;
    if !tables
        .lines()
        .any(|line| line.trim() == format!("table {TABLE}"))
    {
        return Ok(None);
    }
    let (family, name) = TABLE.split_at(2);
    nft(netns, &["list", "table", family, name.trim()], None).map(Some)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config(uplink: &str) -> EgressConfig {
        EgressConfig {
            range: EgressRange::default(),
            uplink: uplink.to_string(),
        }
    }

    #[test]
    fn ruleset_recreates_the_table_with_one_masquerade_rule() {
        let text = ruleset(&config("eth0")).unwrap();
        assert_eq!(
            text,
            "add table ip corral\n\
             delete table ip corral\n\
             table ip corral {\n\
             \tchain postrouting {\n\
             \t\ttype nat hook postrouting priority srcnat; policy accept;\n\
             \t\tip saddr 10.87.0.0/22 oifname \"eth0\" masquerade\n\
             \t}\n\
             }\n"
        );
    }

    #[test]
    fn removal_is_add_then_delete() {
        assert_eq!(
            removal_ruleset(),
            "add table ip corral\ndelete table ip corral\n"
        );
    }

    #[test]
    fn uplink_names_cannot_inject_rules() {
        for bad in ["", "eth0\" accept", "a;b", "sixteen-chars-xx", "e th0"] {
            let err = ruleset(&config(bad)).unwrap_err();
            assert!(matches!(err, EgressError::InterfaceName { .. }), "{bad:?}");
        }
        for ok in ["eth0", "enp0s31f6", "br-lab.1", "wg_0"] {
            ruleset(&config(ok)).unwrap();
        }
    }
}
