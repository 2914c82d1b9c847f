package main

// The saga's activities: the same inventory and payment services over gRPC (proto/), called
// exactly as the order service calls them (services/order/src/saga.rs): idempotency key
// `<saga_id>:<step>`, reservation and payment ids = the saga id. The confirmation publishes
// OrderConfirmed (v2) or OrderCancelled (v1) on the `<prefix>.order` topic with the CloudEvents
// headers the outbox relay writes, so inventory's consumer commits (or forgets) the stock as it
// does for sagaworks, as the Restate peer does.

import (
	"context"
	"crypto/rand"
	"encoding/json"
	"fmt"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	inv "sagaworks.dev/bench/temporal-peer/gen/inventorypb"
	pay "sagaworks.dev/bench/temporal-peer/gen/paymentpb"
)

// Activities holds the participants' clients and the producer (nil: publish nothing).
type Activities struct {
	Inventory inv.InventoryServiceClient
	Payment   pay.PaymentServiceClient
	Producer  *kgo.Client
	Topic     string
}

// The answers the participants give for a business refusal (libs/saga/src/grpc.rs:
// `Rejected`): final, not retried. Anything else may be a transport problem and is retried.
var rejections = map[codes.Code]bool{
	codes.InvalidArgument:    true,
	codes.NotFound:           true,
	codes.FailedPrecondition: true,
	codes.Aborted:            true,
	codes.AlreadyExists:      true,
	codes.OutOfRange:         true,
	codes.PermissionDenied:   true,
	codes.Unauthenticated:    true,
}

// answer maps a call's error to a forward step's answer: nil error and no rejection for
// success, a rejection for a business refusal, an error (retried) otherwise.
func answer(step string, err error) (StepAnswer, error) {
	if err == nil {
		return StepAnswer{}, nil
	}
	if s, ok := status.FromError(err); ok && rejections[s.Code()] {
		return StepAnswer{Rejected: step + ": " + s.Message()}, nil
	}
	return StepAnswer{}, fmt.Errorf("%s: %w", step, err)
}

// undone: a compensation's refusal is no success (it is retried until done, like the saga
// library's compensations).
func undone(step string, err error) error {
	if err == nil {
		return nil
	}
	return fmt.Errorf("%s: %w", step, err)
}

func key(r StepRequest, step string) string { return r.SagaID + ":" + step }

// ReserveStock is reserve_stock.
func (a *Activities) ReserveStock(ctx context.Context, r StepRequest) (StepAnswer, error) {
	items := make([]*inv.ReserveItem, 0, len(r.Items))
	for _, i := range r.Items {
		items = append(items, &inv.ReserveItem{ProductId: i.ProductID, Quantity: i.Quantity})
	}
	res, err := a.Inventory.ReserveStock(ctx, &inv.ReserveStockRequest{
		IdempotencyKey: key(r, "reserve_stock"),
		ReservationId:  r.SagaID,
		OrderId:        r.OrderID,
		Items:          items,
	})
	if err != nil {
		return answer("reserve_stock", err)
	}
	return StepAnswer{TotalCents: res.GetTotalCents()}, nil
}

// ReleaseStock is release_stock, reserve_stock's compensation.
func (a *Activities) ReleaseStock(ctx context.Context, r StepRequest) error {
	_, err := a.Inventory.ReleaseReservation(ctx, &inv.ReleaseReservationRequest{
		IdempotencyKey: key(r, "release_stock"),
		ReservationId:  r.SagaID,
		OrderId:        r.OrderID,
		Reason:         r.Reason,
	})
	return undone("release_stock", err)
}

// ChargePayment is charge_payment, the pivot.
func (a *Activities) ChargePayment(ctx context.Context, r StepRequest) (StepAnswer, error) {
	_, err := a.Payment.Charge(ctx, &pay.ChargeRequest{
		IdempotencyKey: key(r, "charge_payment"),
		PaymentId:      r.SagaID,
		CustomerId:     r.CustomerID,
		OrderId:        r.OrderID,
		AmountCents:    r.AmountCents,
	})
	return answer("charge_payment", err)
}

// RefundPayment is refund_payment, charge_payment's compensation.
func (a *Activities) RefundPayment(ctx context.Context, r StepRequest) error {
	_, err := a.Payment.Refund(ctx, &pay.RefundRequest{
		IdempotencyKey: key(r, "refund_payment"),
		PaymentId:      r.SagaID,
		OrderId:        r.OrderID,
		Reason:         r.Reason,
	})
	return undone("refund_payment", err)
}

type orderConfirmed struct {
	OrderID        string   `json:"order_id"`
	CustomerID     string   `json:"customer_id"`
	SagaID         string   `json:"saga_id"`
	ReservationIDs []string `json:"reservation_ids"`
	PaymentID      string   `json:"payment_id"`
	TotalCents     int64    `json:"total_cents"`
}

type orderCancelled struct {
	OrderID       string `json:"order_id"`
	CustomerID    string `json:"customer_id"`
	SagaID        string `json:"saga_id"`
	ReservationID string `json:"reservation_id"`
	PaymentID     string `json:"payment_id"`
	TotalCents    int64  `json:"total_cents"`
	Reason        string `json:"reason"`
}

// ConfirmOrder ends the saga: OrderConfirmed (v2) when r.Status is CONFIRMED, OrderCancelled
// (v1) otherwise, with the event id r.EventID.
func (a *Activities) ConfirmOrder(ctx context.Context, r StepRequest) error {
	if a.Producer == nil {
		return nil
	}
	var (
		typ     string
		version int
		payload any
	)
	if r.Status == "CONFIRMED" {
		typ, version = "OrderConfirmed", 2
		payload = orderConfirmed{r.OrderID, r.CustomerID, r.SagaID, []string{r.SagaID}, r.SagaID, r.AmountCents}
	} else {
		typ, version = "OrderCancelled", 1
		payload = orderCancelled{r.OrderID, r.CustomerID, r.SagaID, r.SagaID, r.SagaID, r.AmountCents, r.Reason}
	}
	value, err := json.Marshal(payload)
	if err != nil {
		return err
	}
	h := func(k, v string) kgo.RecordHeader { return kgo.RecordHeader{Key: k, Value: []byte(v)} }
	record := &kgo.Record{
		Topic: a.Topic,
		Key:   []byte(r.OrderID),
		Value: value,
		Headers: []kgo.RecordHeader{
			h("ce_id", r.EventID),
			h("ce_type", typ),
			h("ce_source", "/sagaworks/order"),
			h("ce_specversion", "1.0"),
			h("ce_time", time.Now().UTC().Format(time.RFC3339Nano)),
			h("ce_schemaversion", fmt.Sprint(version)),
			h("ce_aggregateid", r.OrderID),
			h("content-type", "application/json"),
			h("ce_dataschema", fmt.Sprintf("urn:sagaworks:event:%s:v%d", typ, version)),
		},
	}
	return a.Producer.ProduceSync(ctx, record).FirstErr()
}

// randomUUID is a UUIDv4.
func randomUUID() string {
	var b [16]byte
	if _, err := rand.Read(b[:]); err != nil {
		panic(err)
	}
	b[6] = b[6]&0x0f | 0x40
	b[8] = b[8]&0x3f | 0x80
	return fmt.Sprintf("%x-%x-%x-%x-%x", b[0:4], b[4:6], b[6:8], b[8:10], b[10:16])
}
