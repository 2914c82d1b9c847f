//! The steps behind trait objects: a definition holds steps of different types
//! in one list, their outputs as JSON.

use crate::statement::Statement;
use crate::step::{Action, Compensation, Saga, StepContext, StepError};
use futures::future::BoxFuture;

pub(crate) trait ForwardDyn<S: Saga>: Send + Sync {
    fn run<'a>(&'a self, ctx: &'a StepContext<'a, S>) -> BoxFuture<'a, Result<serde_json::Value, StepError>>;
    fn record(
        &self,
        ctx: &StepContext<'_, S>,
        output: &serde_json::Value,
        w: &mut Statement,
    ) -> Result<(), StepError>;
    /// Fails unless `output` decodes as the step's output.
    fn check(&self, output: &serde_json::Value) -> Result<(), StepError>;
    /// The output type's JSON Schema (for the fingerprint).
    fn output_schema(&self) -> serde_json::Value;
}

struct Forward<A>(A);

impl<S: Saga, A: Action<S>> ForwardDyn<S> for Forward<A> {
    fn run<'a>(&'a self, ctx: &'a StepContext<'a, S>) -> BoxFuture<'a, Result<serde_json::Value, StepError>> {
        Box::pin(async move {
            let output = self.0.run(ctx).await?;
            serde_json::to_value(output)
                .map_err(|e| StepError::Failed(format!("output of {} does not encode: {e}", A::NAME)))
        })
    }

    fn record(
        &self,
        ctx: &StepContext<'_, S>,
        output: &serde_json::Value,
        w: &mut Statement,
    ) -> Result<(), StepError> {
        let output: A::Output = serde_json::from_value(output.clone())
            .map_err(|e| StepError::Failed(format!("output of {} does not decode: {e}", A::NAME)))?;
        self.0.record(ctx, &output, w)
    }

    fn check(&self, output: &serde_json::Value) -> Result<(), StepError> {
        serde_json::from_value::<A::Output>(output.clone())
            .map(|_| ())
            .map_err(|e| StepError::Rejected(format!("not an output of {}: {e}", A::NAME)))
    }

    fn output_schema(&self) -> serde_json::Value {
        schemars::schema_for!(A::Output).to_value()
    }
}

pub(crate) trait CompensationDyn<S: Saga>: Send + Sync {
    fn run<'a>(&'a self, ctx: &'a StepContext<'a, S>) -> BoxFuture<'a, Result<(), StepError>>;
}

struct Undo<C>(C);

impl<S: Saga, C: Compensation<S>> CompensationDyn<S> for Undo<C> {
    fn run<'a>(&'a self, ctx: &'a StepContext<'a, S>) -> BoxFuture<'a, Result<(), StepError>> {
        Box::pin(self.0.run(ctx))
    }
}

/// `action` as the engine holds it.
pub(super) fn forward<S: Saga, A: Action<S>>(action: A) -> Box<dyn ForwardDyn<S>> {
    Box::new(Forward(action))
}

/// `c`, named, as the engine holds it.
pub(super) fn undo<S: Saga, C: Compensation<S>>(c: C) -> Option<(&'static str, Box<dyn CompensationDyn<S>>)> {
    Some((C::NAME, Box::new(Undo(c))))
}
