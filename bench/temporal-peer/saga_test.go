package main

// The workflow's paths in Temporal's test environment (no server): the activities are mocks,
// and each test checks which steps ran and how the saga ended.

import (
	"context"
	"errors"
	"testing"

	"github.com/stretchr/testify/mock"
	"go.temporal.io/sdk/activity"
	"go.temporal.io/sdk/converter"
	"go.temporal.io/sdk/testsuite"
)

type saga struct {
	env   *testsuite.TestWorkflowEnvironment
	calls []string
}

func newSaga(t *testing.T) *saga {
	var suite testsuite.WorkflowTestSuite
	s := &saga{env: suite.NewTestWorkflowEnvironment()}
	s.env.RegisterWorkflowWithOptions(OrderSaga, workflowOptions())
	s.env.RegisterActivity(&Activities{})
	s.env.SetOnActivityStartedListener(func(info *activity.Info, _ context.Context, _ converter.EncodedValues) {
		s.calls = append(s.calls, info.ActivityType.Name)
	})
	return s
}

func (s *saga) run(t *testing.T) OrderResult {
	t.Helper()
	s.env.ExecuteWorkflow(WorkflowName, OrderInput{
		OrderID: "0190a0a0-0000-7000-8000-000000000001", CustomerID: "0190a0a0-0000-7000-8000-000000000002",
		Items: []Item{{ProductID: "0190a0a0-0000-7000-8000-000000000003", Quantity: 2}},
	})
	if !s.env.IsWorkflowCompleted() {
		t.Fatal("the workflow did not complete")
	}
	if err := s.env.GetWorkflowError(); err != nil {
		t.Fatalf("the workflow failed: %v", err)
	}
	var r OrderResult
	if err := s.env.GetWorkflowResult(&r); err != nil {
		t.Fatal(err)
	}
	return r
}

func expectCalls(t *testing.T, got []string, want ...string) {
	t.Helper()
	if len(got) != len(want) {
		t.Fatalf("steps %v, want %v", got, want)
	}
	for i := range got {
		if got[i] != want[i] {
			t.Fatalf("steps %v, want %v", got, want)
		}
	}
}

func confirmedWith(status string) any {
	return mock.MatchedBy(func(r StepRequest) bool { return r.Status == status && r.EventID != "" })
}

func TestConfirmed(t *testing.T) {
	s := newSaga(t)
	var charged StepRequest
	s.env.OnActivity("ReserveStock", mock.Anything, mock.Anything).Return(StepAnswer{TotalCents: 1200}, nil)
	s.env.OnActivity("ChargePayment", mock.Anything, mock.Anything).Return(
		func(_ context.Context, r StepRequest) (StepAnswer, error) { charged = r; return StepAnswer{}, nil })
	s.env.OnActivity("ConfirmOrder", mock.Anything, confirmedWith("CONFIRMED")).Return(nil)
	r := s.run(t)
	if r.Status != "CONFIRMED" || r.TotalCents != 1200 || r.FailureReason != nil {
		t.Fatalf("%+v", r)
	}
	if charged.AmountCents != 1200 || charged.SagaID == "" || key(charged, "charge_payment") != charged.SagaID+":charge_payment" {
		t.Fatalf("charge request %+v", charged)
	}
	expectCalls(t, s.calls, "ReserveStock", "ChargePayment", "ConfirmOrder")
}

func TestReservationRejected(t *testing.T) {
	s := newSaga(t)
	s.env.OnActivity("ReserveStock", mock.Anything, mock.Anything).Return(StepAnswer{Rejected: "reserve_stock: short"}, nil)
	s.env.OnActivity("ConfirmOrder", mock.Anything, confirmedWith("CANCELLED")).Return(nil)
	r := s.run(t)
	if r.Status != "CANCELLED" || r.FailureReason == nil || *r.FailureReason != "reserve_stock: short" {
		t.Fatalf("%+v", r)
	}
	expectCalls(t, s.calls, "ReserveStock", "ConfirmOrder")
}

func TestReservationFailedIsReleased(t *testing.T) {
	s := newSaga(t)
	s.env.OnActivity("ReserveStock", mock.Anything, mock.Anything).Return(StepAnswer{}, errors.New("unavailable"))
	s.env.OnActivity("ReleaseStock", mock.Anything, mock.Anything).Return(nil)
	s.env.OnActivity("ConfirmOrder", mock.Anything, confirmedWith("CANCELLED")).Return(nil)
	r := s.run(t)
	if r.Status != "CANCELLED" {
		t.Fatalf("%+v", r)
	}
	// Three attempts of the forward step, then its compensation.
	expectCalls(t, s.calls, "ReserveStock", "ReserveStock", "ReserveStock", "ReleaseStock", "ConfirmOrder")
}

func TestChargeRejectedReleasesTheStock(t *testing.T) {
	s := newSaga(t)
	s.env.OnActivity("ReserveStock", mock.Anything, mock.Anything).Return(StepAnswer{TotalCents: 500}, nil)
	s.env.OnActivity("ChargePayment", mock.Anything, mock.Anything).Return(StepAnswer{Rejected: "charge_payment: insufficient funds"}, nil)
	s.env.OnActivity("ReleaseStock", mock.Anything, mock.MatchedBy(func(r StepRequest) bool {
		return r.Reason == "charge_payment: insufficient funds"
	})).Return(nil)
	s.env.OnActivity("ConfirmOrder", mock.Anything, confirmedWith("CANCELLED")).Return(nil)
	r := s.run(t)
	if r.Status != "CANCELLED" || r.TotalCents != 500 {
		t.Fatalf("%+v", r)
	}
	expectCalls(t, s.calls, "ReserveStock", "ChargePayment", "ReleaseStock", "ConfirmOrder")
}

func TestChargeFailedIsRefundedThenReleased(t *testing.T) {
	s := newSaga(t)
	s.env.OnActivity("ReserveStock", mock.Anything, mock.Anything).Return(StepAnswer{TotalCents: 500}, nil)
	s.env.OnActivity("ChargePayment", mock.Anything, mock.Anything).Return(StepAnswer{}, errors.New("deadline exceeded"))
	s.env.OnActivity("RefundPayment", mock.Anything, mock.Anything).Return(nil)
	s.env.OnActivity("ReleaseStock", mock.Anything, mock.Anything).Return(nil)
	s.env.OnActivity("ConfirmOrder", mock.Anything, confirmedWith("CANCELLED")).Return(nil)
	r := s.run(t)
	if r.Status != "CANCELLED" {
		t.Fatalf("%+v", r)
	}
	expectCalls(t, s.calls, "ReserveStock", "ChargePayment", "ChargePayment", "ChargePayment",
		"RefundPayment", "ReleaseStock", "ConfirmOrder")
}
