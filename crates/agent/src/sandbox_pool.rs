//! The warm pool of pod sandboxes: a few pods' worth of namespaces made
//! ahead, while the node is otherwise idle, so `node/create-sandbox` of a
//! new pod takes one ready-made instead of making it on the pod's critical
//! path (docs/design/0033-sandbox-pool.md).
//!
//! A spare is what every default (runc, user-namespaced) pod's sandbox
//! starts as: a user namespace mapped to an id range of its own (held in
//! the range table under `spare:NAME`), the network namespace it owns with
//! `lo` up, and, when the node has a pod network, a veth whose node end
//! (`crs…`, down, no address) has its peer already in the namespace as
//! `eth0`. Claiming one gives its id range to the pod, re-pins its
//! namespaces under the pod's own name (`pod-<uid>`) and renames the veth
//! to the pod's; the pod's address, egress and routes are then wired as
//! for any pod. A claimed sandbox is thereafter exactly a pod's own: its
//! removal, restart and recovery do not know the pool.
//!
//! The pool keeps [`POOL_SIZE`] spares and makes them one at a time, only
//! while no pod of the node is starting: from the moment a new pod's id
//! range is reserved (its first node step) until its containers have been
//! started, or [`START_HOLD_LIMIT`] has passed. Making a spare (the
//! namespace helper, a network namespace, a veth) takes 5–17 ms of a
//! 2-core node, and landing in a pod's `runc run` it made that pod's start
//! about as much slower; between two starts it lands on the next pod's
//! placement and address instead, work of the API server. A burst of pods
//! is not slowed by its own refill either. None is made while a
//! [`PoolHold`] lives (the pods the agent restores at start, until each
//! has checked or recovered its sandbox). Spares are removed when the
//! agent stops and, left by one that did not stop cleanly, when it starts.
//! The bookkeeping ([`PoolBook`]) is pure and unit-tested; the namespaces
//! and links are made by the agent's usual [`NetnsManager`] and
//! [`crate::network`].
//!
//! [`NetnsManager`]: corral_runtime::oci::netns::NetnsManager

use std::collections::{BTreeMap, VecDeque};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use corral_runtime::oci::userns::IdRange;
use sha2::{Digest, Sha256};
use tokio_util::sync::CancellationToken;

use crate::AgentContext;
use crate::idranges::{IdRanges, Transfer};
use crate::sandbox::IDS_PER_POD;

/// How many spares the node keeps ready.
pub const POOL_SIZE: usize = 2;

/// The longest a pod's start keeps the pool from making spares: a start
/// that waits on a long image pull, the node's fence or a failure it never
/// reports lets the pool go on after this.
pub const START_HOLD_LIMIT: Duration = Duration::from_secs(2);

/// How long the pool waits after a spare could not be made.
const RETRY_DELAY: Duration = Duration::from_secs(5);

/// The namespaces of spares are pinned as `spare-N` (and `spare-N.user`).
pub const SPARE_PREFIX: &str = "spare-";

/// A spare's id range is held in the range table as `spare:NAME`.
pub const RANGE_PREFIX: &str = "spare:";

/// One ready-made sandbox.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Spare {
    /// `spare-N`: the name its namespaces are pinned under.
    pub name: String,
    /// The first host id of its user namespace's range.
    pub host_base: u32,
    /// The node end of its veth, when the node has a pod network.
    pub veth: Option<String>,
}

impl Spare {
    /// The key its id range is held under until a pod claims it.
    pub fn range_key(&self) -> String {
        range_key(&self.name)
    }
}

fn range_key(name: &str) -> String {
    format!("{RANGE_PREFIX}{name}")
}

/// The node end of the veth of the spare pinned at `net`: `crs` and 11 hex
/// digits of its path's hash, as long as a pod's (`crl…`), so renaming it to
/// the pod's always fits, and distinct between agents sharing a host.
pub fn spare_veth_name(net: &Path) -> String {
    let digest = Sha256::digest(net.as_os_str().as_encoded_bytes());
    let hex: String = digest.iter().map(|b| format!("{b:02x}")).collect();
    format!("crs{}", &hex[..11])
}

/// The pool's bookkeeping: spares ready, spares reserved for a pod (its id
/// range already given to it) and not yet taken, spares being made.
#[derive(Debug, Default)]
pub struct PoolBook {
    target: usize,
    ready: VecDeque<Spare>,
    reserved: BTreeMap<String, Spare>,
    making: usize,
    next: u64,
    closed: bool,
    /// New pods starting on the node, and since when (no spare is made
    /// meanwhile).
    starting: BTreeMap<String, Instant>,
}

impl PoolBook {
    pub fn new(target: usize) -> Self {
        PoolBook {
            target,
            ..PoolBook::default()
        }
    }

    /// How many spares should be made now.
    pub fn to_make(&self) -> usize {
        if self.closed {
            return 0;
        }
        self.target.saturating_sub(self.ready.len() + self.making)
    }

    /// The name of the next spare to make, counted as being made; `None`
    /// when the pool is full or closed.
    pub fn start_making(&mut self) -> Option<String> {
        if self.to_make() == 0 {
            return None;
        }
        self.making += 1;
        self.next += 1;
        Some(format!("{SPARE_PREFIX}{}", self.next))
    }

    /// A spare is made (`Some`) or could not be (`None`). A spare made
    /// after the pool closed is handed back to be removed.
    pub fn finish_making(&mut self, spare: Option<Spare>) -> Option<Spare> {
        self.making = self.making.saturating_sub(1);
        match spare {
            Some(spare) if self.closed => Some(spare),
            Some(spare) => {
                self.ready.push_back(spare);
                None
            }
            None => None,
        }
    }

    /// The oldest ready spare.
    pub fn take_ready(&mut self) -> Option<Spare> {
        self.ready.pop_front()
    }

    /// Puts back a spare a claim could not use.
    pub fn put_back(&mut self, spare: Spare) {
        self.ready.push_front(spare);
    }

    /// `spare`'s id range now belongs to pod `uid`: it waits for the
    /// pod's `node/create-sandbox`.
    pub fn reserve(&mut self, uid: &str, spare: Spare) {
        self.reserved.insert(uid.to_string(), spare);
    }

    /// The spare reserved for pod `uid`, if any.
    pub fn take_reserved(&mut self, uid: &str) -> Option<Spare> {
        self.reserved.remove(uid)
    }

    /// Closes the pool: nothing more is made, and every spare (ready, and
    /// reserved with whether its range is a pod's) is returned to remove.
    pub fn close(&mut self) -> Vec<(Spare, bool)> {
        self.closed = true;
        let ready = self.ready.drain(..).map(|spare| (spare, false));
        let reserved = std::mem::take(&mut self.reserved)
            .into_values()
            .map(|spare| (spare, true));
        ready.chain(reserved).collect()
    }

    /// Pod `uid` begins its start at `now` (its id range is reserved).
    pub fn begin_start(&mut self, uid: &str, now: Instant) {
        self.starting.entry(uid.to_string()).or_insert(now);
    }

    /// Pod `uid`'s containers were started (or it was removed); whether it
    /// was starting.
    pub fn end_start(&mut self, uid: &str) -> bool {
        self.starting.remove(uid).is_some()
    }

    /// When the pool may make spares again if no start ends before: `None`
    /// when no pod is starting (starts older than [`START_HOLD_LIMIT`] are
    /// forgotten).
    pub fn busy_until(&mut self, now: Instant) -> Option<Instant> {
        self.starting
            .retain(|_, since| now.duration_since(*since) < START_HOLD_LIMIT);
        self.starting
            .values()
            .map(|since| *since + START_HOLD_LIMIT)
            .min()
    }

    pub fn ready(&self) -> usize {
        self.ready.len()
    }

    pub fn making(&self) -> usize {
        self.making
    }
}

/// The node's pool (one per agent).
#[derive(Debug)]
pub struct SandboxPool {
    book: Mutex<PoolBook>,
    /// Told of each claim, so the pool refills, of each pod's start ended
    /// and of each hold let go.
    claimed: tokio::sync::Notify,
    /// How many [`PoolHold`]s live: no spare is made meanwhile.
    holds: AtomicUsize,
}

/// Keeps the pool from making spares while it lives: held by each pod the
/// agent restores until its worker has checked (and, after a reboot,
/// recovered) its sandbox. A recovered pod keeps its own id range, so no
/// spare can serve it, and making spares then would take the CPU the
/// recoveries need.
#[derive(Debug)]
pub struct PoolHold(Arc<SandboxPool>);

impl Drop for PoolHold {
    fn drop(&mut self) {
        self.0.holds.fetch_sub(1, Ordering::SeqCst);
        self.0.claimed.notify_one();
    }
}

impl SandboxPool {
    pub fn new(size: usize) -> Self {
        SandboxPool {
            book: Mutex::new(PoolBook::new(size)),
            claimed: tokio::sync::Notify::new(),
            holds: AtomicUsize::new(0),
        }
    }

    /// Holds the pool from making spares until the hold is dropped.
    pub fn hold(self: &Arc<Self>) -> PoolHold {
        self.holds.fetch_add(1, Ordering::SeqCst);
        PoolHold(self.clone())
    }

    fn held(&self) -> bool {
        self.holds.load(Ordering::SeqCst) > 0
    }

    fn book(&self) -> MutexGuard<'_, PoolBook> {
        // The book stays consistent across a panic (every change is one
        // statement): a poisoned lock is still usable.
        self.book.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The first host id of pod `uid`'s range: its own if it holds one,
    /// else a ready spare's (reserved for it until its
    /// `node/create-sandbox` takes it), else a newly allocated one. Used
    /// by every step that needs the range, whichever runs first.
    pub fn reserve_range(&self, ranges: &IdRanges, uid: &str) -> Result<u32, String> {
        // Held throughout, so two steps of one pod never take two spares
        // and a reserved spare is in the book before anyone looks for it.
        let mut book = self.book();
        if let Some(base) = ranges.get(uid) {
            return Ok(base);
        }
        // A new pod: no spare is made until its containers run.
        book.begin_start(uid, Instant::now());
        if let Some(spare) = book.take_ready() {
            match ranges.transfer(&spare.range_key(), uid) {
                Ok(Transfer::Moved(base)) => {
                    book.reserve(uid, spare);
                    drop(book);
                    self.claimed.notify_one();
                    return Ok(base);
                }
                Ok(Transfer::AlreadyHeld(base)) => {
                    book.put_back(spare);
                    return Ok(base);
                }
                Err(error) => {
                    tracing::warn!(spare = %spare.name, %error, "cannot give a spare sandbox's id range to a pod");
                    book.put_back(spare);
                }
            }
        }
        drop(book);
        ranges.allocate(uid)
    }

    /// The spare reserved for pod `uid`, if any.
    pub fn take_reserved(&self, uid: &str) -> Option<Spare> {
        self.book().take_reserved(uid)
    }

    /// Pod `uid`'s containers were started, or it is being removed: the
    /// pool may make spares again once no other pod is starting.
    pub fn start_done(&self, uid: &str) {
        if self.book().end_start(uid) {
            self.claimed.notify_one();
        }
    }

    /// How many spares are ready.
    pub fn ready(&self) -> usize {
        self.book().ready()
    }
}

/// Gives `spare` (reserved for the pod) to the pod: its namespaces pinned
/// as `name`, its veth renamed to the pod's (`owner`). Returns the pod's
/// network namespace. On failure the spare is removed (its id range stays
/// the pod's) and the caller makes the sandbox as usual.
pub async fn adopt(
    ctx: &AgentContext,
    spare: Spare,
    name: &str,
    owner: &str,
) -> Result<PathBuf, String> {
    let netns = ctx.netns.clone();
    let (from, to) = (spare.name.clone(), name.to_string());
    let moved = tokio::task::spawn_blocking(move || netns.move_pinned(&from, &to))
        .await
        .map_err(|e| e.to_string())
        .and_then(|moved| moved.map_err(|e| crate::chain(&e)));
    let pinned = match moved {
        Ok(pinned) => pinned,
        Err(error) => {
            remove(ctx, spare, true).await;
            return Err(error);
        }
    };
    if let (Some(veth), Some(network)) = (&spare.veth, &ctx.network)
        && let Err(error) = network.claim_spare_interface(veth, owner).await
    {
        // The pod's wiring makes a veth of its own.
        tracing::warn!(spare = %spare.name, error = %crate::chain(&error), "cannot rename a spare veth; the pod gets a new one");
        let _ = network.remove_interface(veth).await;
    }
    Ok(pinned.net)
}

/// Makes spare `name`: its id range, namespaces and veth.
async fn make(ctx: &AgentContext, name: &str) -> Result<Spare, String> {
    let (netns, ranges, spare_name) = (ctx.netns.clone(), ctx.id_ranges.clone(), name.to_string());
    let host_base = tokio::task::spawn_blocking(move || {
        let host_base = ranges.allocate(&range_key(&spare_name))?;
        let ids = IdRange {
            host_base,
            size: IDS_PER_POD,
        };
        match netns.create_with_user_namespace(&spare_name, ids) {
            Ok(_) => Ok(host_base),
            Err(error) => {
                let _ = ranges.release(&range_key(&spare_name));
                Err(crate::chain(&error))
            }
        }
    })
    .await
    .map_err(|e| e.to_string())??;
    let mut spare = Spare {
        name: name.to_string(),
        host_base,
        veth: None,
    };
    if let Some(network) = &ctx.network {
        let net = ctx.netns.path(name).map_err(|e| crate::chain(&e))?;
        let veth = spare_veth_name(&net);
        if let Err(error) = network.make_spare_interface(&veth, &net).await {
            let _ = network.remove_interface(&veth).await;
            remove(ctx, spare, false).await;
            return Err(crate::chain(&error));
        }
        spare.veth = Some(veth);
    }
    Ok(spare)
}

/// Removes `spare`: its veth, namespaces and (unless a pod holds it now)
/// id range.
async fn remove(ctx: &AgentContext, spare: Spare, range_is_a_pods: bool) {
    if let (Some(veth), Some(network)) = (&spare.veth, &ctx.network)
        && let Err(error) = network.remove_interface(veth).await
    {
        tracing::warn!(spare = %spare.name, error = %crate::chain(&error), "cannot remove a spare veth");
    }
    let (netns, ranges) = (ctx.netns.clone(), ctx.id_ranges.clone());
    let removed = tokio::task::spawn_blocking(move || {
        netns
            .remove(&spare.name)
            .map_err(|e| crate::chain(&e))
            .and_then(|()| {
                if range_is_a_pods {
                    Ok(())
                } else {
                    ranges
                        .release(&spare.range_key())
                        .map_err(|e| crate::chain(&e))
                }
            })
            .map_err(|error| (spare.name, error))
    })
    .await;
    if let Ok(Err((spare, error))) = removed {
        tracing::warn!(%spare, %error, "cannot remove a spare sandbox");
    }
}

/// Removes the spare reserved for pod `uid` that its `node/create-sandbox`
/// never took (the pod is removed first); its id range is the pod's.
pub async fn discard_reserved(ctx: &AgentContext, uid: &str) {
    if let Some(spare) = ctx.sandbox_pool.take_reserved(uid) {
        remove(ctx, spare, true).await;
    }
}

/// Removes spares an agent left behind that did not stop cleanly: their
/// veths, namespaces (`spare-*` in the namespace dir) and id ranges.
pub async fn sweep_stale(ctx: &AgentContext) -> usize {
    let names: Vec<String> = std::fs::read_dir(ctx.netns.run_dir())
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|entry| entry.file_name().into_string().ok())
        .filter(|name| name.starts_with(SPARE_PREFIX) && !name.ends_with(".user"))
        .collect();
    for name in &names {
        let spare = Spare {
            name: name.clone(),
            host_base: 0,
            veth: ctx
                .network
                .as_ref()
                .and_then(|_| ctx.netns.path(name).ok())
                .map(|net| spare_veth_name(&net)),
        };
        remove(ctx, spare, false).await;
    }
    match ctx.id_ranges.release_prefixed(RANGE_PREFIX) {
        Ok(released) => names.len().max(released),
        Err(error) => {
            tracing::warn!(error = %crate::chain(&error), "cannot free spare sandboxes' id ranges");
            names.len()
        }
    }
}

/// Keeps the pool full until `shutdown`, then removes every spare.
pub async fn run(ctx: Arc<AgentContext>, shutdown: CancellationToken) {
    let swept = sweep_stale(&ctx).await;
    if swept > 0 {
        tracing::info!(swept, "removed spare sandboxes a previous agent left");
    }
    let pool = &ctx.sandbox_pool;
    loop {
        if pool.held() {
            // A hold let go notifies (a permit is kept if it comes first).
            tokio::select! {
                () = pool.claimed.notified() => continue,
                () = shutdown.cancelled() => break,
            }
        }
        let busy_until = pool.book().busy_until(Instant::now());
        if let Some(until) = busy_until {
            // A start ending (or a claim) notifies; a start that never
            // reports its end is forgotten at `until`.
            tokio::select! {
                () = pool.claimed.notified() => {}
                () = tokio::time::sleep_until(until.into()) => {}
                () = shutdown.cancelled() => break,
            }
            continue;
        }
        let name = pool.book().start_making();
        match name {
            Some(name) => {
                // Never cancelled mid-way (that would leave half a spare):
                // a spare made as the agent stops is removed below.
                match make(&ctx, &name).await {
                    Ok(spare) => {
                        tracing::debug!(spare = %spare.name, "spare sandbox ready");
                        let late = pool.book().finish_making(Some(spare));
                        if let Some(late) = late {
                            remove(&ctx, late, false).await;
                        }
                    }
                    Err(error) => {
                        pool.book().finish_making(None);
                        tracing::warn!(%name, %error, "cannot make a spare sandbox");
                        tokio::select! {
                            () = tokio::time::sleep(RETRY_DELAY) => {}
                            () = shutdown.cancelled() => {}
                        }
                    }
                }
                if shutdown.is_cancelled() {
                    break;
                }
            }
            None => {
                // A claim makes room; the claiming pod's start then holds
                // the refill until its containers run (above).
                tokio::select! {
                    () = pool.claimed.notified() => {}
                    () = shutdown.cancelled() => break,
                }
            }
        }
    }
    let spares = pool.book().close();
    for (spare, range_is_a_pods) in spares {
        remove(&ctx, spare, range_is_a_pods).await;
    }
}

#[cfg(test)]
mod tests;
