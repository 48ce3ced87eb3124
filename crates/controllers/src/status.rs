//! A controller's write of the status it keeps on an object (a Job's, a
//! deployment's): only when it differs from the stored one, so an
//! unchanged plan costs no write and wakes no watcher.

use corral_api::Object;
use corral_client::{Client, ClientError};
use serde::Serialize;
use serde::de::DeserializeOwned;

/// Writes `status` as `object`'s status unless it is already that.
pub(crate) async fn write_if_changed<S>(
    client: &Client,
    object: &Object,
    status: &S,
) -> Result<(), ClientError>
where
    S: Serialize + DeserializeOwned + PartialEq + Default,
{
    let current: S = object.typed_status().unwrap_or_default();
    if current == *status {
        return Ok(());
    }
    let mut next = object.clone();
    next.status = serde_json::to_value(status).map_err(ClientError::Decode)?;
    client.put_status(&next).await?;
    Ok(())
}
