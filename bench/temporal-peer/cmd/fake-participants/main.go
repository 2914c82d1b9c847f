// Command fake-participants serves inventory's and payment's saga calls (ReserveStock,
// ReleaseReservation, Charge, Refund) on one loopback port with canned answers and no
// storage: every reservation and charge succeeds (each unit costs 1000 cents). With it the
// Temporal peer runs without the dev stack, so that the orchestration's own cost (the
// Temporal server, the worker, the HTTP front) can be measured apart from the participants'.
// Not the side-by-side comparison: scripts/bench-peer is.
//
//	go run ./cmd/fake-participants [-addr 127.0.0.1:17082]
package main

import (
	"context"
	"flag"
	"log"
	"net"

	"google.golang.org/grpc"

	inv "sagaworks.dev/bench/temporal-peer/gen/inventorypb"
	pay "sagaworks.dev/bench/temporal-peer/gen/paymentpb"
)

type inventory struct {
	inv.UnimplementedInventoryServiceServer
}

func (inventory) ReserveStock(_ context.Context, r *inv.ReserveStockRequest) (*inv.Reservation, error) {
	res := &inv.Reservation{ReservationId: r.GetReservationId(), OrderId: r.GetOrderId(), Status: inv.ReservationStatus_RESERVATION_STATUS_RESERVED}
	for _, i := range r.GetItems() {
		res.Lines = append(res.Lines, &inv.ReservedLine{ProductId: i.GetProductId(), Quantity: i.GetQuantity(), UnitPriceCents: 1000})
		res.TotalCents += 1000 * i.GetQuantity()
	}
	return res, nil
}

func (inventory) ReleaseReservation(_ context.Context, r *inv.ReleaseReservationRequest) (*inv.Reservation, error) {
	return &inv.Reservation{ReservationId: r.GetReservationId(), OrderId: r.GetOrderId(), Status: inv.ReservationStatus_RESERVATION_STATUS_RELEASED}, nil
}

type payment struct {
	pay.UnimplementedPaymentServiceServer
}

func (payment) Charge(_ context.Context, r *pay.ChargeRequest) (*pay.Payment, error) {
	return &pay.Payment{PaymentId: r.GetPaymentId(), CustomerId: r.GetCustomerId(), OrderId: r.GetOrderId(), AmountCents: r.GetAmountCents()}, nil
}

func (payment) Refund(_ context.Context, r *pay.RefundRequest) (*pay.Payment, error) {
	return &pay.Payment{PaymentId: r.GetPaymentId(), OrderId: r.GetOrderId()}, nil
}

func main() {
	addr := flag.String("addr", "127.0.0.1:17082", "listen address (loopback)")
	flag.Parse()
	lis, err := net.Listen("tcp", *addr)
	if err != nil {
		log.Fatal(err)
	}
	s := grpc.NewServer()
	inv.RegisterInventoryServiceServer(s, inventory{})
	pay.RegisterPaymentServiceServer(s, payment{})
	log.Printf("fake-participants: inventory and payment on %s", *addr)
	log.Fatal(s.Serve(lis))
}
