//! The job that tells one endpoint about the endpoints themselves
//! (`endpoint.disabled`): queued by the breaker, performed by the webhook
//! delivery in `effects`.

use outbox_core::worker::JobArgs;
use serde::{Deserialize, Serialize};

use crate::kinds::EffectKind;
use crate::orders::EndpointId;

/// A notice about the endpoints themselves (`endpoint.disabled`) to one
/// endpoint subscribed to it: the body is made when the notice is queued.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct EndpointNotice {
    /// The endpoint told.
    pub endpoint_id: EndpointId,
    /// The event, as it is sent (`{"type","id","timestamp","data"}`).
    pub event: serde_json::Value,
}

impl JobArgs for EndpointNotice {
    const KIND: &'static str = EffectKind::EndpointNotice.as_str();
}
