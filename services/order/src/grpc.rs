//! The gRPC face of order: creating orders starts their saga; reads
//! assemble the order with its saga steps and event timeline.

use crate::error::{Error, Result};
use crate::orders::{self, Created, NewOrder, Order, TimelineEntry};
use crate::saga::PlaceOrder;
use sagaworks_errors::status::invalid_argument;
use sagaworks_errors::validate::{order_lines, text, uuid};
use sagaworks_outbox::OutboxWriter;
use sagaworks_proto::order::v1 as pb;
use sagaworks_proto::order::v1::order_service_server::OrderService;
use sagaworks_proto::timestamp;
use sagaworks_saga::admin::{self, ActionRecord, Cursor, ListFilter, StatusFilter, Summary};
use sagaworks_saga::{Engine, InstanceRecord, Operator, OperatorAction, Saga};
use sha2::{Digest, Sha256};
use sqlx::PgPool;
use std::time::Duration;
use tokio_util::sync::CancellationToken;
use tonic::{Request, Response, Status};

const MAX_ITEMS: usize = 100;
const MAX_QUANTITY: i64 = 1_000_000;

#[derive(Clone)]
pub struct Orders {
    pool: PgPool,
    outbox: OutboxWriter,
    saga: Engine<PlaceOrder>,
    shutdown: CancellationToken,
}

impl Orders {
    pub fn new(pool: PgPool, saga: Engine<PlaceOrder>, shutdown: CancellationToken) -> Self {
        Self { pool, outbox: OutboxWriter::new("order"), saga, shutdown }
    }

    /// A saga with its operators' actions.
    async fn saga_view(&self, saga_id: uuid::Uuid) -> Result<pb::Saga> {
        let mut conn = self.pool.acquire().await?;
        let saga = orders::saga(&mut conn, saga_id).await?;
        drop(conn);
        let actions = admin::actions(&self.pool, saga_id).await?;
        Ok(pb::Saga { actions: actions.into_iter().map(action_pb).collect(), ..self.saga_pb(saga) })
    }

    /// A saga record with each step's role from the definition.
    fn saga_pb(&self, saga: InstanceRecord) -> pb::Saga {
        // The roles of the version it runs on.
        let definition = self.saga.definition_of(saga.version).unwrap_or_else(|| self.saga.definition());
        let shape = definition.shape();
        let mut saga = saga_pb(saga);
        for step in &mut saga.steps {
            step.role = shape.role(&step.name).unwrap_or_default().to_string();
        }
        saga
    }

    async fn view(&self, order_id: uuid::Uuid) -> Result<pb::Order> {
        let mut conn = self.pool.acquire().await?;
        let view = orders::view(&mut conn, order_id).await?;
        let saga = view.saga.map(|s| self.saga_pb(s));
        Ok(order_pb(view.order, saga, view.timeline))
    }
}

/// Same customer and lines (in product order) = same request.
fn request_hash(new_customer: uuid::Uuid, lines: &std::collections::BTreeMap<uuid::Uuid, i64>) -> Vec<u8> {
    let mut h = Sha256::new();
    h.update(new_customer.as_bytes());
    for (p, q) in lines {
        h.update(p.as_bytes());
        h.update(q.to_be_bytes());
    }
    h.finalize().to_vec()
}

/// The trace id in a W3C `traceparent` (`00-<trace id>-<span id>-<flags>`).
fn trace_id(traceparent: Option<&str>) -> String {
    traceparent.and_then(|t| t.split('-').nth(1)).unwrap_or_default().to_string()
}

fn summary_pb(s: Summary) -> pb::SagaSummary {
    let i = s.instance;
    pb::SagaSummary {
        saga_id: i.id.to_string(),
        trace_id: trace_id(i.traceparent.as_deref()),
        order_id: i.key,
        status: i.status.to_string(),
        current_step: i.current_step.unwrap_or_default(),
        attempts: s.attempts.unwrap_or(0).max(0) as u32,
        last_error: s.last_error.unwrap_or_default(),
        created_at: Some(timestamp(i.created_at)),
        progressed_at: Some(timestamp(i.progressed_at)),
        failure_reason: i.failure_reason.unwrap_or_default(),
    }
}

fn action_pb(a: ActionRecord) -> pb::SagaOperatorAction {
    pb::SagaOperatorAction {
        action: a.action,
        step: a.step,
        actor: a.actor,
        reason: a.reason,
        at: Some(timestamp(a.at)),
    }
}

fn saga_pb(s: InstanceRecord) -> pb::Saga {
    pb::Saga {
        trace_id: trace_id(s.traceparent.as_deref()),
        progressed_at: Some(timestamp(s.progressed_at)),
        actions: Vec::new(),
        version: s.version.max(0) as u32,
        saga_id: s.id.to_string(),
        // The order saga's business key is its order's id.
        order_id: s.key,
        status: s.status.to_string(),
        // Empty once the saga has finished.
        current_step: s.current_step.unwrap_or_default(),
        steps: s
            .steps
            .into_iter()
            .map(|st| pb::SagaStep {
                name: st.name,
                status: st.status.to_string(),
                attempts: st.attempts.max(0) as u32,
                error: st.error.unwrap_or_default(),
                started_at: Some(timestamp(st.started_at)),
                finished_at: st.finished_at.map(timestamp),
                role: String::new(),
                history: st
                    .history
                    .into_iter()
                    .map(|a| pb::SagaAttempt {
                        attempt: a.attempt.max(0) as u32,
                        started_at: Some(timestamp(a.started_at)),
                        ended_at: Some(timestamp(a.ended_at)),
                        outcome: a.outcome,
                        error: a.error.unwrap_or_default(),
                    })
                    .collect(),
            })
            .collect(),
        failure_reason: s.failure_reason.unwrap_or_default(),
        created_at: Some(timestamp(s.created_at)),
        updated_at: Some(timestamp(s.updated_at)),
    }
}

fn order_pb(o: Order, saga: Option<pb::Saga>, timeline: Vec<TimelineEntry>) -> pb::Order {
    pb::Order {
        order_id: o.id.to_string(),
        customer_id: o.customer_id.to_string(),
        status: o.status,
        items: o
            .items
            .into_iter()
            .map(|i| pb::OrderItem {
                product_id: i.product_id.to_string(),
                quantity: i.quantity,
                unit_price_cents: i.unit_price_cents,
            })
            .collect(),
        total_cents: o.total_cents,
        failure_reason: o.failure_reason.unwrap_or_default(),
        saga,
        timeline: timeline
            .into_iter()
            .map(|t| pb::TimelineEntry {
                event_id: t.event_id.to_string(),
                event_type: t.event_type,
                source: t.source,
                occurred_at: Some(timestamp(t.occurred_at)),
            })
            .collect(),
        trace_id: o.trace_id.unwrap_or_default(),
        created_at: Some(timestamp(o.created_at)),
        updated_at: Some(timestamp(o.updated_at)),
    }
}

#[tonic::async_trait]
impl OrderService for Orders {
    #[tracing::instrument(skip_all, fields(customer_id = %request.get_ref().customer_id))]
    async fn create_order(
        &self,
        request: Request<pb::CreateOrderRequest>,
    ) -> Result<Response<pb::CreateOrderResponse>, Status> {
        let r = request.into_inner();
        let customer_id = uuid("customer_id", &r.customer_id)?;
        let items = order_lines(
            r.items.iter().map(|i| (i.product_id.as_str(), i.quantity)),
            MAX_ITEMS,
            MAX_QUANTITY,
        )?;
        // Without a key there is nothing to deduplicate on: every call is new.
        let idempotency_key = if r.idempotency_key.is_empty() {
            format!("generated:{}", uuid::Uuid::new_v4())
        } else {
            text("idempotency_key", &r.idempotency_key, 200)?
        };
        let new = NewOrder {
            customer_id,
            request_hash: request_hash(customer_id, &items),
            items,
            idempotency_key,
            // This call's span, kept with the order.
            traceparent: sagaworks_telemetry::propagation::current_traceparent(),
        };
        // One statement, atomic on its own: no transaction needed.
        let mut conn = self.pool.acquire().await.map_err(Error::from)?;
        let created = orders::create(&mut conn, &self.outbox, &self.saga, &new).await?;
        drop(conn);
        let (order_id, replayed) = match created {
            Created::New { order_id, saga } => {
                let wait =
                    Duration::from_millis(u64::from(r.wait_millis).min(self.saga.settings().max_wait_ms));
                saga.run(wait, &self.shutdown).await;
                (order_id, false)
            }
            Created::Replayed { order_id } => (order_id, true),
        };
        let order = self.view(order_id).await?;
        Ok(Response::new(pb::CreateOrderResponse { order: Some(order), replayed }))
    }

    async fn get_order(&self, request: Request<pb::GetOrderRequest>) -> Result<Response<pb::Order>, Status> {
        let id = uuid("order_id", &request.get_ref().order_id)?;
        Ok(Response::new(self.view(id).await?))
    }

    async fn list_orders(
        &self,
        request: Request<pb::ListOrdersRequest>,
    ) -> Result<Response<pb::ListOrdersResponse>, Status> {
        let r = request.into_inner();
        let customer_id = uuid("customer_id", &r.customer_id)?;
        let limit = match r.limit {
            0 => 50,
            n => n.min(500),
        };
        let mut conn = self.pool.acquire().await.map_err(Error::from)?;
        let orders = orders::list(&mut conn, customer_id, limit as i64).await?;
        let orders = orders.into_iter().map(|o| order_pb(o, None, vec![])).collect();
        Ok(Response::new(pb::ListOrdersResponse { orders }))
    }

    async fn get_saga(&self, request: Request<pb::GetSagaRequest>) -> Result<Response<pb::Saga>, Status> {
        let id = uuid("saga_id", &request.get_ref().saga_id)?;
        Ok(Response::new(self.saga_view(id).await?))
    }

    async fn list_sagas(
        &self,
        request: Request<pb::ListSagasRequest>,
    ) -> Result<Response<pb::ListSagasResponse>, Status> {
        let r = request.into_inner();
        let status = match r.status.as_str() {
            "" => None,
            s => Some(s.parse::<StatusFilter>().map_err(|e| invalid_argument("status", e))?),
        };
        let after = match r.cursor.as_str() {
            "" => None,
            c => Some(c.parse::<Cursor>().map_err(|e| invalid_argument("cursor", e))?),
        };
        if !r.step.is_empty() && (r.step.len() > 63 || !sagaworks_saga::valid_name(&r.step)) {
            return Err(invalid_argument(
                "step",
                "a step name: a lower-case letter, then letters, digits and '_'",
            ));
        }
        // About ten years: beyond it an interval overflows, and no saga is that old.
        if r.older_than_secs > 315_360_000 {
            return Err(invalid_argument("older_than", "must be at most 315360000 seconds"));
        }
        let keys = match r.customer_id.as_str() {
            "" => None,
            c => Some(orders::ids_of_customer(&self.pool, uuid("customer_id", c)?).await?),
        };
        let filter = ListFilter {
            status,
            step: (!r.step.is_empty()).then(|| r.step.clone()),
            older_than: (r.older_than_secs > 0).then(|| Duration::from_secs(r.older_than_secs)),
            keys,
            after,
            limit: r.limit,
        };
        let stuck_after = Duration::from_millis(self.saga.settings().stuck_after_ms);
        let page =
            admin::list(&self.pool, PlaceOrder::NAME, stuck_after, &filter).await.map_err(Error::from)?;
        Ok(Response::new(pb::ListSagasResponse {
            sagas: page.sagas.into_iter().map(summary_pb).collect(),
            next_cursor: page.next.map(|c| c.to_string()).unwrap_or_default(),
        }))
    }

    async fn list_saga_versions(
        &self,
        _request: Request<pb::ListSagaVersionsRequest>,
    ) -> Result<Response<pb::ListSagaVersionsResponse>, Status> {
        let versions = self.saga.versions().await.map_err(Error::from)?;
        Ok(Response::new(pb::ListSagaVersionsResponse {
            versions: versions
                .into_iter()
                .map(|v| pb::SagaVersion {
                    saga_type: PlaceOrder::NAME.into(),
                    version: v.version,
                    unfinished: v.unfinished,
                    fingerprint: v.fingerprint,
                    registered: v.registered,
                    starts_new: v.starts_new,
                })
                .collect(),
        }))
    }

    #[tracing::instrument(skip_all, fields(saga.id = %request.get_ref().saga_id, action = %request.get_ref().action))]
    async fn act_on_saga(
        &self,
        request: Request<pb::ActOnSagaRequest>,
    ) -> Result<Response<pb::ActOnSagaResponse>, Status> {
        let r = request.into_inner();
        let id = uuid("saga_id", &r.saga_id)?;
        let action = match r.action.as_str() {
            "retry" => OperatorAction::RetryNow,
            "compensate" => OperatorAction::Compensate,
            "resolve" => OperatorAction::Resolve {
                output: match r.output_json.trim() {
                    "" => serde_json::Value::Null,
                    json => serde_json::from_str(json)
                        .map_err(|e| invalid_argument("output", format!("not JSON: {e}")))?,
                },
            },
            other => {
                return Err(invalid_argument(
                    "action",
                    format!("{other:?} is not retry, compensate or resolve"),
                ));
            }
        };
        let operator = Operator {
            actor: text("actor", &r.actor, 200)?,
            reason: text("reason", &r.reason, 1000)?,
            idempotency_key: text("idempotency_key", &r.idempotency_key, 200)?,
        };
        let acted = self.saga.act(id, action, &operator).await.map_err(Error::from)?;
        let saga = self.saga_view(id).await?;
        Ok(Response::new(pb::ActOnSagaResponse {
            saga: Some(saga),
            step: acted.step,
            replayed: acted.replayed,
        }))
    }
}
