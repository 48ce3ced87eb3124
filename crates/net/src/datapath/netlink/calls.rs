//! The rtnetlink calls the data path and its neighbours (WireGuard, the
//! lab) share: a connection inside a namespace, finding and raising
//! links, adding addresses, sysctls, and errors that name what failed.

use std::net::IpAddr;
use std::path::Path;

use futures::TryStreamExt;
use rtnetlink::packet_route::address::{AddressAttribute, AddressFlags};
use rtnetlink::packet_route::link::{LinkAttribute, LinkMessage};
use rtnetlink::{Handle, LinkUnspec};

use super::ENODEV;
use crate::datapath::DatapathError;
use crate::netns;

/// Opens an rtnetlink connection inside `netns` (or the caller's namespace
/// for `None`). The socket stays bound to that namespace; its driver task
/// runs on the current tokio runtime until the handle is dropped.
pub async fn connect(netns: Option<&Path>) -> Result<Handle, DatapathError> {
    let runtime = tokio::runtime::Handle::current();
    let created = netns::run_in_optional(netns, move || {
        let _entered = runtime.enter();
        rtnetlink::new_connection()
    })?;
    let (connection, handle, _) = created.map_err(|source| DatapathError::Connect { source })?;
    tokio::spawn(connection);
    Ok(handle)
}

pub(crate) fn errno(error: &rtnetlink::Error) -> Option<i32> {
    match error {
        rtnetlink::Error::NetlinkError(message) => message.code.map(|code| -code.get()),
        _ => None,
    }
}

pub(crate) fn netlink_error(
    operation: impl Into<String>,
) -> impl FnOnce(rtnetlink::Error) -> DatapathError {
    let operation = operation.into();
    move |source| DatapathError::Netlink { operation, source }
}

/// The link called `name`, if it exists.
pub(crate) async fn find_link(
    handle: &Handle,
    name: &str,
) -> Result<Option<LinkMessage>, DatapathError> {
    let mut links = handle.link().get().match_name(name.to_string()).execute();
    match links.try_next().await {
        Ok(link) => Ok(link),
        Err(e) if errno(&e) == Some(ENODEV) => Ok(None),
        Err(e) => Err(netlink_error(format!("get link {name}"))(e)),
    }
}

pub(crate) async fn link_index(
    handle: &Handle,
    name: &str,
    netns: Option<&Path>,
) -> Result<u32, DatapathError> {
    find_link(handle, name)
        .await?
        .map(|link| link.header.index)
        .ok_or_else(|| DatapathError::MissingInterface {
            name: name.to_string(),
            netns: netns.map(Path::to_path_buf),
        })
}

pub(crate) async fn set_up(handle: &Handle, index: u32, name: &str) -> Result<(), DatapathError> {
    handle
        .link()
        .set(LinkUnspec::new_with_index(index).up().build())
        .execute()
        .await
        .map_err(netlink_error(format!("set {name} up")))
}

pub(crate) async fn add_address(
    handle: &Handle,
    index: u32,
    address: IpAddr,
    prefix_len: u8,
    interface: &str,
) -> Result<(), DatapathError> {
    let mut request = handle.address().add(index, address, prefix_len).replace();
    if address.is_ipv6() {
        request
            .message_mut()
            .attributes
            .push(AddressAttribute::Flags(AddressFlags::Nodad));
    }
    request.execute().await.map_err(netlink_error(format!(
        "add address {address}/{prefix_len} to {interface}"
    )))
}

pub(crate) fn write_sysctl(
    netns: Option<&Path>,
    path: &str,
    value: &str,
) -> Result<(), DatapathError> {
    netns::run_in_optional(netns, || std::fs::write(path, value))?.map_err(|source| {
        DatapathError::Sysctl {
            path: path.to_string(),
            source,
        }
    })
}

pub(super) fn link_name(link: &LinkMessage) -> Option<&str> {
    link.attributes.iter().find_map(|a| match a {
        LinkAttribute::IfName(name) => Some(name.as_str()),
        _ => None,
    })
}

pub(super) fn link_alias(link: &LinkMessage) -> Option<&str> {
    link.attributes.iter().find_map(|a| match a {
        LinkAttribute::IfAlias(alias) => Some(alias.as_str()),
        _ => None,
    })
}
