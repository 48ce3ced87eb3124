//! API tokens: rows of the `tokens` table, written by maintenance writes
//! (they are rare) and read on the read connections.

use chrono::{DateTime, Utc};
use rusqlite::{Connection, params};

use super::schema;
use crate::{StoreError, TokenRecord};

/// The columns every token query selects, in [`from_row`]'s order.
const COLUMNS: &str = "hash, identity, created_at, last_used";

pub(super) fn put(conn: &mut Connection, token: &TokenRecord) -> Result<(), StoreError> {
    let identity =
        serde_json::to_string(&token.identity).map_err(schema::corrupt_json("token identity"))?;
    conn.execute(
        "INSERT INTO tokens (hash, identity, created_at, last_used) VALUES (?1, ?2, ?3, ?4)
         ON CONFLICT (hash) DO UPDATE
         SET identity = excluded.identity, created_at = excluded.created_at,
             last_used = excluded.last_used",
        params![
            token.hash,
            identity,
            schema::time_to_text(token.created_at),
            token.last_used_at.map(schema::time_to_text)
        ],
    )?;
    Ok(())
}

pub(super) fn find(conn: &mut Connection, hash: &str) -> Result<Option<TokenRecord>, StoreError> {
    let mut statement =
        conn.prepare_cached(&format!("SELECT {COLUMNS} FROM tokens WHERE hash = ?1"))?;
    let mut rows = statement.query([hash])?;
    rows.next()?.map(from_row).transpose()
}

pub(super) fn list(conn: &mut Connection) -> Result<Vec<TokenRecord>, StoreError> {
    let mut statement = conn.prepare(&format!(
        "SELECT {COLUMNS} FROM tokens ORDER BY created_at, hash"
    ))?;
    let mut rows = statement.query([])?;
    let mut tokens = Vec::new();
    while let Some(row) = rows.next()? {
        tokens.push(from_row(row)?);
    }
    Ok(tokens)
}

pub(super) fn touch(
    conn: &mut Connection,
    hash: &str,
    at: DateTime<Utc>,
) -> Result<(), StoreError> {
    conn.execute(
        "UPDATE tokens SET last_used = ?2 WHERE hash = ?1",
        params![hash, schema::time_to_text(at)],
    )?;
    Ok(())
}

pub(super) fn delete(conn: &mut Connection, hashes: &[String]) -> Result<(), StoreError> {
    let tx = conn.transaction()?;
    for hash in hashes {
        tx.execute("DELETE FROM tokens WHERE hash = ?1", [hash])?;
    }
    tx.commit()?;
    Ok(())
}

/// A token from a row of `hash, identity, created_at, last_used`.
pub(super) fn from_row(row: &rusqlite::Row<'_>) -> Result<TokenRecord, StoreError> {
    let identity: String = row.get(1)?;
    let created_at: String = row.get(2)?;
    let last_used: Option<String> = row.get(3)?;
    Ok(TokenRecord {
        hash: row.get(0)?,
        identity: serde_json::from_str(&identity)
            .map_err(schema::corrupt_json("token identity"))?,
        created_at: schema::time_from_text(&created_at)?,
        last_used_at: last_used
            .as_deref()
            .map(schema::time_from_text)
            .transpose()?,
    })
}
