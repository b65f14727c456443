//! The `Fusebox` service: Acquire, Complete and Renew ([`super::unary`]),
//! the Decide stream and the batches ([`super::decide`]).

use tonic::{Request, Response, Status};

use crate::proto::v1 as pb;
use pb::fusebox_server::Fusebox;

use super::api::Api;
use super::decide;
use crate::telemetry::FUSEBOX_SERVICE;

impl Api {
    async fn acquire_traced(
        &self,
        request: Request<pb::AcquireRequest>,
    ) -> Result<pb::AcquireResponse, Status> {
        let grant = self.grant(&request)?;
        let share = self.node.share_of(grant.as_deref());
        let _calling = decide::calling(self, share.as_ref());
        let peer = super::tls::remote_addr(&request).map(|a| a.ip());
        self.acquire_as(grant.as_deref(), share.as_ref(), peer, request.into_inner())
            .await
    }

    async fn complete_traced(
        &self,
        request: Request<pb::CompleteRequest>,
    ) -> Result<pb::CompleteResponse, Status> {
        let grant = self.grant(&request)?;
        let share = self.node.share_of(grant.as_deref());
        let _calling = decide::calling(self, share.as_ref());
        self.complete_as(grant.as_deref(), share.as_ref(), request.into_inner())
            .await
    }
}

#[tonic::async_trait]
impl Fusebox for Api {
    async fn acquire(
        &self,
        request: Request<pb::AcquireRequest>,
    ) -> Result<Response<pb::AcquireResponse>, Status> {
        let mut trace = self.trace(&request, FUSEBOX_SERVICE, "Acquire");
        trace.key(&request.get_ref().key);
        let answer = self.acquire_traced(request).await;
        trace.acquired(&answer);
        answer.map(Response::new)
    }

    async fn complete(
        &self,
        request: Request<pb::CompleteRequest>,
    ) -> Result<Response<pb::CompleteResponse>, Status> {
        let mut trace = self.trace(&request, FUSEBOX_SERVICE, "Complete");
        self.ticket_key(&mut trace, &request.get_ref().ticket);
        let answer = self.complete_traced(request).await;
        trace.completed(&answer);
        answer.map(Response::new)
    }

    async fn renew(
        &self,
        request: Request<pb::RenewRequest>,
    ) -> Result<Response<pb::RenewResponse>, Status> {
        let mut trace = self.trace(&request, FUSEBOX_SERVICE, "Renew");
        self.ticket_key(&mut trace, &request.get_ref().ticket);
        let answer = async {
            let grant = self.grant(&request)?;
            let share = self.node.share_of(grant.as_deref());
            let _calling = decide::calling(self, share.as_ref());
            self.renew_as(grant.as_deref(), share.as_ref(), request.into_inner())
                .await
        }
        .await;
        trace.ended(&answer);
        answer.map(Response::new)
    }

    type DecideStream = decide::Answers;

    async fn decide(
        &self,
        request: Request<tonic::Streaming<pb::DecideRequest>>,
    ) -> Result<Response<Self::DecideStream>, Status> {
        decide::open(self, request).map(Response::new)
    }

    async fn acquire_batch(
        &self,
        request: Request<pb::AcquireBatchRequest>,
    ) -> Result<Response<pb::AcquireBatchResponse>, Status> {
        decide::acquire_batch(self, request)
            .await
            .map(Response::new)
    }

    async fn complete_batch(
        &self,
        request: Request<pb::CompleteBatchRequest>,
    ) -> Result<Response<pb::CompleteBatchResponse>, Status> {
        decide::complete_batch(self, request)
            .await
            .map(Response::new)
    }
}
