//! [`Operator`]: who acts on a running system by hand (an operator's action on
//! a saga, a dead letter's replay or discard), why, and under which
//! idempotency key.

/// Who acts, why, and the key that makes a repeated call a replay of the first.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Operator {
    pub actor: String,
    pub reason: String,
    pub idempotency_key: String,
}
