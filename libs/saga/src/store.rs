//! The persisted state machine: `saga_instances` and `saga_instance_steps`
//! (see the crate's migrations), their status enums, and the reads a host
//! shows (e.g. an order's saga and its steps).

use crate::step::Saga;
use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use sqlx::{AssertSqlSafe, FromRow, PgExecutor};
use uuid::Uuid;

/// An instance's status.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
pub enum SagaStatus {
    /// Running its forward steps.
    Running,
    /// Running compensations; ends COMPENSATED.
    Compensating,
    Completed,
    Compensated,
}

impl SagaStatus {
    pub fn as_str(self) -> &'static str {
        match self {
            SagaStatus::Running => "RUNNING",
            SagaStatus::Compensating => "COMPENSATING",
            SagaStatus::Completed => "COMPLETED",
            SagaStatus::Compensated => "COMPENSATED",
        }
    }

    pub fn is_finished(self) -> bool {
        matches!(self, SagaStatus::Completed | SagaStatus::Compensated)
    }
}

/// A step's status.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
pub enum StepStatus {
    /// Started (or waiting for its next attempt: `error` says why).
    Running,
    Succeeded,
    /// Rejected, or failed and given up (the saga compensates).
    Failed,
}

impl StepStatus {
    pub fn as_str(self) -> &'static str {
        match self {
            StepStatus::Running => "RUNNING",
            StepStatus::Succeeded => "SUCCEEDED",
            StepStatus::Failed => "FAILED",
        }
    }
}

/// Both enums are stored as their upper-case names in `TEXT` columns.
macro_rules! text_enum {
    ($ty:ident { $($variant:ident),* }) => {
        impl $ty {
            pub fn parse(s: &str) -> Option<Self> {
                [$($ty::$variant),*].into_iter().find(|v| v.as_str() == s)
            }
        }

        impl std::fmt::Display for $ty {
            fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str(self.as_str())
            }
        }

        impl sqlx::Type<sqlx::Postgres> for $ty {
            fn type_info() -> sqlx::postgres::PgTypeInfo {
                <&str as sqlx::Type<sqlx::Postgres>>::type_info()
            }
            fn compatible(ty: &sqlx::postgres::PgTypeInfo) -> bool {
                <&str as sqlx::Type<sqlx::Postgres>>::compatible(ty)
            }
        }

        impl<'r> sqlx::Decode<'r, sqlx::Postgres> for $ty {
            fn decode(value: sqlx::postgres::PgValueRef<'r>) -> Result<Self, sqlx::error::BoxDynError> {
                let s = <&str as sqlx::Decode<sqlx::Postgres>>::decode(value)?;
                $ty::parse(s).ok_or_else(|| format!("unknown {} {s:?}", stringify!($ty)).into())
            }
        }

        impl sqlx::Encode<'_, sqlx::Postgres> for $ty {
            fn encode_by_ref(
                &self,
                buf: &mut sqlx::postgres::PgArgumentBuffer,
            ) -> Result<sqlx::encode::IsNull, sqlx::error::BoxDynError> {
                <&str as sqlx::Encode<sqlx::Postgres>>::encode(self.as_str(), buf)
            }
        }
    };
}

text_enum!(SagaStatus { Running, Compensating, Completed, Compensated });
text_enum!(StepStatus { Running, Succeeded, Failed });

/// One step of an instance, as stored.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(from = "StoredStep")]
pub struct StepRecord {
    pub name: String,
    pub status: StepStatus,
    pub attempts: i32,
    pub error: Option<String>,
    pub started_at: DateTime<Utc>,
    pub finished_at: Option<DateTime<Utc>>,
    /// Each attempt's outcome, oldest first (a success is stored as the
    /// row's status and times, and listed here when the row is read).
    #[serde(default)]
    pub history: Vec<AttemptRecord>,
}

/// A step as [`steps_json`] reads it: `history` holds the attempts that did
/// not simply succeed; a success is the row's own status and times, turned
/// into the last [`AttemptRecord`] here rather than in SQL (the order view
/// reads every step of every order it shows).
#[derive(Deserialize)]
struct StoredStep {
    name: String,
    status: StepStatus,
    attempts: i32,
    error: Option<String>,
    started_at: DateTime<Utc>,
    finished_at: Option<DateTime<Utc>>,
    #[serde(default)]
    history: Vec<AttemptRecord>,
    /// Absent from a serialised [`StepRecord`]: its history is complete.
    #[serde(default)]
    attempt_started_at: Option<DateTime<Utc>>,
}

impl From<StoredStep> for StepRecord {
    fn from(s: StoredStep) -> Self {
        let mut history = s.history;
        // An operator's `resolved` is the success's own entry.
        if let (StepStatus::Succeeded, Some(started_at), Some(ended_at)) =
            (s.status, s.attempt_started_at, s.finished_at)
            && history.last().is_none_or(|a| a.outcome != "resolved")
        {
            history.push(AttemptRecord {
                attempt: s.attempts,
                started_at,
                ended_at,
                outcome: "succeeded".into(),
                error: None,
            });
        }
        StepRecord {
            name: s.name,
            status: s.status,
            attempts: s.attempts,
            error: s.error,
            started_at: s.started_at,
            finished_at: s.finished_at,
            history,
        }
    }
}

/// One attempt of a step: when it ran and how it ended (`succeeded`,
/// `rejected`, `failed`, or an operator's `resolved` / `abandoned`).
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct AttemptRecord {
    pub attempt: i32,
    pub started_at: DateTime<Utc>,
    pub ended_at: DateTime<Utc>,
    pub outcome: String,
    pub error: Option<String>,
}

/// An instance, as stored, with its steps in the order they started.
#[derive(Debug, Clone, Serialize, Deserialize, FromRow)]
pub struct InstanceRecord {
    pub id: Uuid,
    pub saga_type: String,
    /// The version of the definition it started on (and runs on).
    pub version: i32,
    pub key: String,
    pub status: SagaStatus,
    /// The step that runs next; `None` once the saga has finished.
    pub current_step: Option<String>,
    pub failure_reason: Option<String>,
    /// The W3C trace context of the call that started it.
    pub traceparent: Option<String>,
    pub created_at: DateTime<Utc>,
    pub updated_at: DateTime<Utc>,
    /// The last transition; see [`crate::admin::StatusFilter::Stuck`].
    pub progressed_at: DateTime<Utc>,
    pub finished_at: Option<DateTime<Utc>>,
    #[sqlx(skip)]
    #[serde(default)]
    pub steps: Vec<StepRecord>,
}

/// The columns of [`InstanceRecord`].
pub(crate) const INSTANCE_COLUMNS: &str = "id, saga_type, version, key, status, current_step, failure_reason, traceparent, \
     created_at, updated_at, progressed_at, finished_at";

/// A SQL expression for a host's own queries: the instance of saga `S` whose
/// key is the SQL expression `key`, with its steps, as the JSON of an
/// [`InstanceRecord`] (decode it as `sqlx::types::Json<InstanceRecord>`), or
/// NULL when there is none.
pub fn instance_json<S: Saga>(key: &str) -> String {
    // A definition's name is lower case, digits and `_`; quoted all the same.
    format!(
        "(SELECT row_to_json(s) FROM (
              SELECT {INSTANCE_COLUMNS}, {steps} AS steps
              FROM saga_instances i WHERE i.saga_type = '{saga}' AND i.key = {key}) s)",
        steps = steps_json("i"),
        saga = S::NAME.replace('\'', "''"),
    )
}

/// A JSON expression of an instance's steps as [`StepRecord`]s (for
/// `sqlx::types::Json<Vec<StepRecord>>`), `instance` being the SQL name of
/// the instance's row.
pub(crate) fn steps_json(instance: &str) -> String {
    format!(
        "(SELECT COALESCE(json_agg(st ORDER BY st.started_at, st.name), '[]')
          FROM (SELECT name, status, attempts, error, started_at, finished_at, history, attempt_started_at
                FROM saga_instance_steps WHERE saga_id = {instance}.id) st)"
    )
}

impl InstanceRecord {
    /// Instance `id` with its steps, if it exists, in one round trip.
    pub async fn load<'c, E: PgExecutor<'c>>(db: E, id: Uuid) -> Result<Option<Self>, sqlx::Error> {
        #[derive(FromRow)]
        struct Row {
            #[sqlx(flatten)]
            instance: InstanceRecord,
            steps: sqlx::types::Json<Vec<StepRecord>>,
        }
        let row = sqlx::query_as::<_, Row>(AssertSqlSafe(format!(
            "SELECT {INSTANCE_COLUMNS}, {} AS steps FROM saga_instances i WHERE i.id = $1",
            steps_json("i")
        )))
        .bind(id)
        .fetch_optional(db)
        .await?;
        Ok(row.map(|row| InstanceRecord { steps: row.steps.0, ..row.instance }))
    }
}
