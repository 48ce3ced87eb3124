//! An inline step running while the executor reports the detached steps
//! that end beside it.

use std::collections::BTreeSet;

use corral_api::ObjectKey;
use futures::future::BoxFuture;
use tokio::task::JoinSet;

use super::{StepEnd, StepRun, Workload, record};
use crate::steps::{Attempt, NodeWork, StepApi, StepApiError, StepBatch};

/// One inline step running, with the detached steps that end meanwhile
/// reported at once, each in the request of its own end: a step's time in
/// `why` is its own, not that of the step it ran beside. The inline step
/// goes on while such a report is in flight; when it ends first, the
/// report is waited for, so requests about one object never overlap.
pub(super) struct InlineRun<'a> {
    pub(super) api: &'a dyn StepApi,
    pub(super) key: &'a ObjectKey,
    pub(super) finished: &'a mut BTreeSet<Attempt>,
    pub(super) running_detached: &'a mut BTreeSet<Attempt>,
    pub(super) detached: &'a mut JoinSet<StepEnd>,
}

/// What the reports sent during an inline step came to: the freshest
/// instance the API returned, and reports that could not be sent (to go
/// with the next request).
pub(super) type InlineOutcome = (StepRun, Option<NodeWork>, Option<(StepBatch, Vec<Attempt>)>);

/// A report sent during an inline step: the answer, and what it carried.
type Sent = (Result<NodeWork, StepApiError>, StepBatch, Vec<Attempt>);

impl<'a> InlineRun<'a> {
    pub(super) async fn run<W: Workload>(
        self,
        workload: &mut W,
        step: &str,
        work: &NodeWork,
    ) -> InlineOutcome {
        let InlineRun {
            api,
            key,
            finished,
            running_detached,
            detached,
        } = self;
        let mut current = work.clone();
        let mut fresh = None;
        let mut unsent: Option<(StepBatch, Vec<Attempt>)> = None;
        let mut sending: Option<BoxFuture<'a, Sent>> = None;
        let mut ended: Option<StepRun> = None;
        let running = workload.run_step(step, work);
        tokio::pin!(running);
        loop {
            tokio::select! {
                biased;
                run = &mut running, if ended.is_none() => ended = Some(run),
                Some(sent) = poll_sending(&mut sending), if sending.is_some() => {
                    sending = None;
                    match sent {
                        (Ok(work), _, attempts) => {
                            finished.extend(attempts);
                            current = work.clone();
                            fresh = Some(work);
                        }
                        (Err(error), early, attempts) => {
                            tracing::debug!(object = %key, %error, "step report not applied; sent again with the next");
                            unsent = Some((early, attempts));
                        }
                    }
                }
                Some(joined) = detached.join_next(),
                    if !detached.is_empty() && sending.is_none() && ended.is_none() =>
                {
                    let (mut early, mut attempts) = unsent.take().unwrap_or_default();
                    let mut next = Some(joined);
                    while let Some(joined) = next {
                        if let Ok((done, attempt, run)) = joined {
                            running_detached.remove(&current.attempt(&done, attempt));
                            record(&current, &done, attempt, run, &mut early, &mut attempts);
                        }
                        next = detached.try_join_next();
                    }
                    if !early.is_empty() {
                        sending = Some(Box::pin(async move {
                            let answer = api.batch(key, &early).await;
                            (answer, early, attempts)
                        }));
                    }
                }
            }
            if sending.is_none()
                && let Some(run) = ended.take()
            {
                return (run, fresh, unsent);
            }
        }
    }
}

/// The answer of the report in flight, if any.
async fn poll_sending(sending: &mut Option<BoxFuture<'_, Sent>>) -> Option<Sent> {
    match sending {
        Some(future) => Some(future.await),
        None => None,
    }
}
