//! The gRPC face of payment: validates requests, runs them on the database,
//! maps domain values to the protobuf contract.

use crate::error::Error;
use crate::ledger::{self, Account, Charge, Payment, PaymentStatus};
use sagaworks_errors::validate::{text, uuid, uuid_or_new, within};
use sagaworks_outbox::OutboxWriter;
use sagaworks_proto::payment::v1 as pb;
use sagaworks_proto::payment::v1::payment_service_server::PaymentService;
use sagaworks_runtime::idempotency;
use sqlx::PgPool;
use tonic::{Request, Response, Status};

/// Largest amount one call may move: 1 billion cents.
const MAX_AMOUNT: i64 = 100_000_000_000;

#[derive(Clone)]
pub struct Payments {
    pool: PgPool,
    outbox: OutboxWriter,
}

impl Payments {
    pub fn new(pool: PgPool) -> Self {
        Self { pool, outbox: OutboxWriter::new("payment") }
    }
}

fn account(a: Account) -> pb::Account {
    pb::Account {
        customer_id: a.customer_id.to_string(),
        name: a.name,
        balance_cents: a.balance_cents,
        created_at: Some(sagaworks_proto::timestamp(a.created_at)),
    }
}

fn payment(p: Payment) -> pb::Payment {
    let status = match p.status {
        PaymentStatus::Charged => pb::PaymentStatus::Charged,
        PaymentStatus::Refunded => pb::PaymentStatus::Refunded,
        PaymentStatus::Voided => pb::PaymentStatus::Voided,
    };
    pb::Payment {
        payment_id: p.id.to_string(),
        customer_id: p.customer_id.to_string(),
        order_id: p.order_id.to_string(),
        amount_cents: p.amount_cents,
        status: status as i32,
    }
}

#[tonic::async_trait]
impl PaymentService for Payments {
    #[tracing::instrument(skip_all)]
    async fn create_customer(
        &self,
        request: Request<pb::CreateCustomerRequest>,
    ) -> Result<Response<pb::Account>, Status> {
        let r = request.into_inner();
        let id = uuid_or_new("customer_id", &r.customer_id)?;
        let name = text("name", &r.name, 200)?;
        let credit = within("initial_credit_cents", r.initial_credit_cents, 0..=MAX_AMOUNT)?;
        let outbox = self.outbox.clone();
        let res = idempotency::run_once(&self.pool, &r.idempotency_key, &r, move |conn| {
            Box::pin(async move {
                Ok::<_, Error>(account(ledger::open_account(conn, &outbox, id, &name, credit).await?))
            })
        })
        .await?;
        Ok(Response::new(res))
    }

    #[tracing::instrument(skip_all, fields(customer_id = %request.get_ref().customer_id))]
    async fn add_credit(
        &self,
        request: Request<pb::AddCreditRequest>,
    ) -> Result<Response<pb::Account>, Status> {
        let r = request.into_inner();
        let id = uuid("customer_id", &r.customer_id)?;
        let amount = within("amount_cents", r.amount_cents, 1..=MAX_AMOUNT)?;
        let outbox = self.outbox.clone();
        let res = idempotency::run_once(&self.pool, &r.idempotency_key, &r, move |conn| {
            Box::pin(
                async move { Ok::<_, Error>(account(ledger::add_credit(conn, &outbox, id, amount).await?)) },
            )
        })
        .await?;
        Ok(Response::new(res))
    }

    async fn get_account(
        &self,
        request: Request<pb::GetAccountRequest>,
    ) -> Result<Response<pb::Account>, Status> {
        let id = uuid("customer_id", &request.get_ref().customer_id)?;
        let mut conn = self.pool.acquire().await.map_err(Error::from)?;
        Ok(Response::new(account(ledger::get_account(&mut conn, id).await?)))
    }

    #[tracing::instrument(skip_all, fields(payment_id = %request.get_ref().payment_id))]
    async fn charge(&self, request: Request<pb::ChargeRequest>) -> Result<Response<pb::Payment>, Status> {
        let r = request.into_inner();
        let charge = Charge {
            payment_id: uuid("payment_id", &r.payment_id)?,
            customer_id: uuid("customer_id", &r.customer_id)?,
            order_id: uuid("order_id", &r.order_id)?,
            amount_cents: within("amount_cents", r.amount_cents, 0..=MAX_AMOUNT)?,
        };
        let outbox = self.outbox.clone();
        let res = idempotency::run_once(&self.pool, &r.idempotency_key, &r, move |conn| {
            Box::pin(async move { Ok::<_, Error>(payment(ledger::charge(conn, &outbox, charge).await?)) })
        })
        .await?;
        Ok(Response::new(res))
    }

    #[tracing::instrument(skip_all, fields(payment_id = %request.get_ref().payment_id))]
    async fn refund(&self, request: Request<pb::RefundRequest>) -> Result<Response<pb::Payment>, Status> {
        let r = request.into_inner();
        let payment_id = uuid("payment_id", &r.payment_id)?;
        let order_id = uuid("order_id", &r.order_id)?;
        let reason: String = r.reason.chars().take(500).collect();
        let outbox = self.outbox.clone();
        let res = idempotency::run_once(&self.pool, &r.idempotency_key, &r, move |conn| {
            Box::pin(async move {
                Ok::<_, Error>(payment(ledger::refund(conn, &outbox, payment_id, order_id, &reason).await?))
            })
        })
        .await?;
        Ok(Response::new(res))
    }
}
