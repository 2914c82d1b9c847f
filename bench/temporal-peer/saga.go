package main

// The order saga of sagaworks (services/order/src/saga.rs, version 1), as a Temporal workflow:
//
//	reserve_stock ──ok──> charge_payment ──ok──> confirm_order ──> CONFIRMED
//	     │                     │
//	 rejected: CANCELLED   rejected ──────────────────┐
//	 failed ─────────┐     failed ──> refund_payment ──> release_stock ──> CANCELLED
//	                 └──────────────────────────────────────────^
//
// The same shape as bench/restate-peer and the saga library: a rejection (a business refusal
// of the participant) is final and needs no compensation of its own step; a step whose
// attempts ran out may have happened, so it is compensated too (a charge that timed out is
// refunded). Each participant call is an activity: Temporal records its result in the
// workflow's history, and a replay reads it back instead of calling again.

import (
	"errors"
	"time"

	"go.temporal.io/sdk/temporal"
	"go.temporal.io/sdk/workflow"
)

// WorkflowName is the workflow type the HTTP front starts.
const WorkflowName = "OrderSaga"

// Per-attempt deadline of a participant call (the resilience stack's `timeout_ms`).
const attemptTimeout = 2 * time.Second

// Forward steps: 3 attempts, then the saga compensates (the stack's `retry.max_attempts`).
var forwardRetry = &temporal.RetryPolicy{
	InitialInterval:    50 * time.Millisecond,
	BackoffCoefficient: 2,
	MaximumInterval:    time.Second,
	MaximumAttempts:    3,
}

// Compensations and the confirmation: retried until done, backoff capped.
var untilDoneRetry = &temporal.RetryPolicy{
	InitialInterval:    50 * time.Millisecond,
	BackoffCoefficient: 2,
	MaximumInterval:    5 * time.Second,
	MaximumAttempts:    0,
}

// Item is one line of an order.
type Item struct {
	ProductID string `json:"product_id"`
	Quantity  int64  `json:"quantity"`
}

// OrderInput is what the workflow starts from: the order id (the workflow id) and the body of
// the gateway's `POST /v1/orders`.
type OrderInput struct {
	OrderID    string `json:"order_id"`
	CustomerID string `json:"customer_id"`
	Items      []Item `json:"items"`
}

// OrderResult is the workflow's result and the HTTP front's answer, as the Restate peer's.
type OrderResult struct {
	OrderID       string  `json:"order_id"`
	Status        string  `json:"status"`
	TotalCents    int64   `json:"total_cents"`
	FailureReason *string `json:"failure_reason"`
}

// StepAnswer is a participant's answer to a forward step: Rejected is set for a business
// refusal (final, not retried); anything else that is not an answer is an activity error,
// retried by the activity's retry policy.
type StepAnswer struct {
	Rejected   string `json:"rejected,omitempty"`
	TotalCents int64  `json:"total_cents,omitempty"`
}

// StepRequest is the input of every activity: the saga's ids and what the step needs.
type StepRequest struct {
	SagaID      string `json:"saga_id"`
	OrderID     string `json:"order_id"`
	CustomerID  string `json:"customer_id"`
	Items       []Item `json:"items,omitempty"`
	AmountCents int64  `json:"amount_cents,omitempty"`
	Reason      string `json:"reason,omitempty"`
	// For the end's event: its id (drawn in the workflow, so a retried publish sends the same
	// id, which inventory's inbox dedupes) and the order's end.
	EventID string `json:"event_id,omitempty"`
	Status  string `json:"status,omitempty"`
}

// OrderSaga is the workflow.
func OrderSaga(ctx workflow.Context, input OrderInput) (OrderResult, error) {
	// The saga's id: reservation and payment ids, and the idempotency keys' prefix
	// (`<saga_id>:<step>`). A side effect: recorded once, the same on every replay.
	sagaID := newUUID(ctx)
	req := StepRequest{SagaID: sagaID, OrderID: input.OrderID, CustomerID: input.CustomerID}

	forward := workflow.WithActivityOptions(ctx, workflow.ActivityOptions{
		StartToCloseTimeout: attemptTimeout,
		RetryPolicy:         forwardRetry,
	})
	untilDone := workflow.WithActivityOptions(ctx, workflow.ActivityOptions{
		StartToCloseTimeout: attemptTimeout,
		RetryPolicy:         untilDoneRetry,
	})
	var a *Activities // method names only: the worker holds the real one

	total := int64(0)
	end := func(status string, reason *string) (OrderResult, error) {
		r := req
		r.EventID = newUUID(ctx)
		r.Status = status
		r.AmountCents = total
		if reason != nil {
			r.Reason = *reason
		}
		if err := workflow.ExecuteActivity(untilDone, a.ConfirmOrder, r).Get(ctx, nil); err != nil {
			return OrderResult{}, err
		}
		return OrderResult{OrderID: input.OrderID, Status: status, TotalCents: total, FailureReason: reason}, nil
	}
	compensate := func(step any, reason string) error {
		r := req
		r.Reason = reason
		return workflow.ExecuteActivity(untilDone, step, r).Get(ctx, nil)
	}
	// A forward step: its answer, or failed (its attempts ran out: it may have happened).
	run := func(step any, name string, r StepRequest) (StepAnswer, *string) {
		var answer StepAnswer
		if err := workflow.ExecuteActivity(forward, step, r).Get(ctx, &answer); err != nil {
			reason := name + ": " + rootMessage(err)
			return answer, &reason
		}
		return answer, nil
	}

	reserve := req
	reserve.Items = input.Items
	reserved, failed := run(a.ReserveStock, "reserve_stock", reserve)
	if failed != nil {
		if err := compensate(a.ReleaseStock, *failed); err != nil {
			return OrderResult{}, err
		}
		return end("CANCELLED", failed)
	}
	if reserved.Rejected != "" {
		return end("CANCELLED", &reserved.Rejected)
	}
	total = reserved.TotalCents

	charge := req
	charge.AmountCents = total
	charged, failed := run(a.ChargePayment, "charge_payment", charge)
	if failed != nil {
		// A charge that timed out may have happened: refunded.
		if err := compensate(a.RefundPayment, *failed); err != nil {
			return OrderResult{}, err
		}
		if err := compensate(a.ReleaseStock, *failed); err != nil {
			return OrderResult{}, err
		}
		return end("CANCELLED", failed)
	}
	if charged.Rejected != "" {
		if err := compensate(a.ReleaseStock, charged.Rejected); err != nil {
			return OrderResult{}, err
		}
		return end("CANCELLED", &charged.Rejected)
	}
	return end("CONFIRMED", nil)
}

// newUUID is a random UUIDv4, recorded in the history (the same on a replay).
func newUUID(ctx workflow.Context) string {
	var id string
	_ = workflow.SideEffect(ctx, func(workflow.Context) any { return randomUUID() }).Get(&id)
	return id
}

// rootMessage is the innermost message of an activity's failure (the participant's words,
// or the timeout).
func rootMessage(err error) string {
	for {
		next := errors.Unwrap(err)
		if next == nil {
			return err.Error()
		}
		err = next
	}
}

func workflowOptions() workflow.RegisterOptions {
	return workflow.RegisterOptions{Name: WorkflowName}
}
