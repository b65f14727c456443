//! Acquire, Complete and Renew as one call does them: the unary calls', and
//! every Decide frame's and batch item's (the same checks, the same answers).

use std::net::IpAddr;
use std::sync::Arc;

use tonic::Status;

use crate::auth::{Grant, Role};
use crate::domain::Decision;
use crate::engine::shares::Share;
use crate::engine::AcquireArgs;
use crate::proto::v1 as pb;
use crate::proto::wire::{duration_of, millis_of, phase_of};

use super::api::Api;
use super::status::{status_of, status_of_refusal};
use super::wire::{caller_of, check_caller, decision_of_kind, outcome_of, reason_of};

impl Api {
    /// Acquire, by `grant` (`None`: authentication is off): the unary
    /// call's and every stream or batch frame's.
    pub(crate) async fn acquire_as(
        &self,
        grant: Option<&Grant>,
        share: Option<&Arc<Share>>,
        peer: Option<IpAddr>,
        req: pb::AcquireRequest,
    ) -> Result<pb::AcquireResponse, Status> {
        if let Some(grant) = grant {
            grant
                .on_key(Role::Caller, "Acquire", &req.key)
                .map_err(status_of_refusal)?;
        }
        check_caller(&req.caller)?;
        let caller = caller_of(grant, req.caller, peer);
        let args = AcquireArgs {
            key: req.key,
            permits: req.permits.unwrap_or(1),
            max_wait: millis_of("max_wait", req.max_wait)?.unwrap_or(0),
            lease: millis_of("lease", req.lease)?,
            attempt: req.attempt.unwrap_or(0),
            caller,
        };
        let reply = self
            .store
            .acquire_as(args, share)
            .await
            .map_err(status_of)?;
        let (decision, reason, retry_after) = match reply.decision {
            Decision::Granted(_) => (pb::Decision::Granted, None, None),
            Decision::Probe(_) => (pb::Decision::Probe, None, None),
            Decision::Blocked {
                reason,
                retry_after,
            } => (pb::Decision::Blocked, Some(reason), Some(retry_after)),
            Decision::Refused => (pb::Decision::Refused, None, None),
            Decision::Denied {
                reason,
                retry_after,
            } => (pb::Decision::Denied, Some(reason), retry_after),
            Decision::Queued => return Err(Status::internal("a queued request was not answered")),
            // D1: granted, with what it would have had; no retry_after.
            Decision::Shadow { .. } => (pb::Decision::Granted, None, None),
        };
        let (shadow_decision, shadow_reason) = match reply.decision.shadow() {
            Some((kind, reason)) => (decision_of_kind(kind), reason_of(reason)),
            None => (pb::Decision::Unspecified, pb::Reason::Unspecified),
        };
        Ok(pb::AcquireResponse {
            decision: decision as i32,
            ticket: reply.ticket.unwrap_or_default(),
            reason: reason.map_or(pb::Reason::Unspecified, reason_of) as i32,
            retry_after: retry_after.map(duration_of),
            lease: reply.lease_left.map(duration_of),
            phase: phase_of(reply.phase) as i32,
            shadow_decision: shadow_decision as i32,
            shadow_reason: shadow_reason as i32,
        })
    }

    /// Checks that `grant` may settle `ticket`: a ticket is completed or
    /// renewed only by a credential allowed on its key.
    fn allow_ticket(&self, grant: Option<&Grant>, what: &str, ticket: &str) -> Result<(), Status> {
        let Some(grant) = grant else {
            return Ok(());
        };
        grant.needs(Role::Caller, what).map_err(status_of_refusal)?;
        let key = self.store.ticket_key(ticket).map_err(status_of)?;
        grant
            .on_key(Role::Caller, what, &key)
            .map_err(status_of_refusal)
    }

    /// Complete, by `grant`.
    pub(crate) async fn complete_as(
        &self,
        grant: Option<&Grant>,
        share: Option<&Arc<Share>>,
        req: pb::CompleteRequest,
    ) -> Result<pb::CompleteResponse, Status> {
        self.allow_ticket(grant, "Complete", &req.ticket)?;
        let outcome = outcome_of(req.outcome)?;
        let done = self
            .store
            .complete_as(&req.ticket, outcome, req.cost, share)
            .await
            .map_err(status_of)?;
        Ok(pb::CompleteResponse {
            stale: done.stale,
            phase: phase_of(done.phase) as i32,
        })
    }

    /// Renew, by `grant`.
    pub(crate) async fn renew_as(
        &self,
        grant: Option<&Grant>,
        share: Option<&Arc<Share>>,
        req: pb::RenewRequest,
    ) -> Result<pb::RenewResponse, Status> {
        self.allow_ticket(grant, "Renew", &req.ticket)?;
        let lease = millis_of("lease", req.lease)?;
        let left = self
            .store
            .renew_as(&req.ticket, lease, share)
            .await
            .map_err(status_of)?;
        Ok(pb::RenewResponse {
            lease: Some(duration_of(left)),
        })
    }
}
