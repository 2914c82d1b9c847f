// Command temporal-peer is the order saga of sagaworks orchestrated by Temporal: the second
// peer of scripts/bench-peer, beside bench/restate-peer.
//
// One process holds the Temporal worker (the workflow OrderSaga and its activities, on task
// queue TASK_QUEUE) and a small HTTP front for the load tool, the counterpart of Restate's
// ingress: `POST /OrderSaga/{order_id}/place` with the body of the gateway's `POST /v1/orders`
// ({customer_id, items: [{product_id, quantity}]}) starts workflow OrderSaga with the order id
// as its workflow id and answers when it finished: 200 with {order_id, status: CONFIRMED |
// CANCELLED, total_cents, failure_reason}; 422 for a body that is no order; 502 when Temporal
// or the workflow failed. A second POST for the same order id attaches to the same workflow
// (conflict policy USE_EXISTING) and answers its result.
//
// Environment: PEER_PORT (19090), TEMPORAL_ADDRESS (127.0.0.1:7233), TEMPORAL_NAMESPACE
// (default), TASK_QUEUE (order-saga), INVENTORY_URL (127.0.0.1:7082), PAYMENT_URL
// (127.0.0.1:7083), KAFKA_BROKERS (127.0.0.1:9092; empty: publish nothing), TOPIC_PREFIX
// (sagaworks), WORKFLOW_POLLERS and ACTIVITY_POLLERS (the worker's pollers per task type; 0,
// the default: the SDK's default, 2); TLS_CA_FILE, TLS_CERT_FILE, TLS_KEY_FILE (mutual TLS to
// the participants; unset: plaintext); KAFKA_SASL_USERNAME, KAFKA_SASL_PASSWORD (SCRAM-SHA-512)
// and KAFKA_CA_FILE (TLS to the broker).
package main

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log"
	"log/slog"
	"net/http"
	"os"
	"os/signal"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/sasl/scram"
	enumspb "go.temporal.io/api/enums/v1"
	"go.temporal.io/sdk/client"
	tlog "go.temporal.io/sdk/log"
	"go.temporal.io/sdk/worker"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"

	inv "sagaworks.dev/bench/temporal-peer/gen/inventorypb"
	pay "sagaworks.dev/bench/temporal-peer/gen/paymentpb"
)

func env(name, fallback string) string {
	if v, ok := os.LookupEnv(name); ok {
		return v
	}
	return fallback
}

func envInt(name string, fallback int) int {
	v, err := strconv.Atoi(env(name, strconv.Itoa(fallback)))
	if err != nil {
		log.Fatalf("temporal-peer: %s: %v", name, err)
	}
	return v
}

var uuidRe = regexp.MustCompile(`^[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}$`)

// orderInput checks the gateway's body as far as the peer needs (the participants check the
// rest), as the Restate peer does.
func orderInput(orderID string, body []byte) (OrderInput, error) {
	var in struct {
		CustomerID string `json:"customer_id"`
		Items      []struct {
			ProductID *string `json:"product_id"`
			Quantity  *int64  `json:"quantity"`
		} `json:"items"`
	}
	if err := json.Unmarshal(body, &in); err != nil {
		return OrderInput{}, errors.New("the body must be an order")
	}
	if !uuidRe.MatchString(in.CustomerID) {
		return OrderInput{}, errors.New("customer_id must be a UUID")
	}
	if len(in.Items) == 0 || len(in.Items) > 100 {
		return OrderInput{}, errors.New("items: 1 to 100 lines")
	}
	out := OrderInput{OrderID: orderID, CustomerID: in.CustomerID}
	for _, i := range in.Items {
		if i.ProductID == nil || i.Quantity == nil || *i.Quantity < 1 {
			return OrderInput{}, errors.New("each item needs a product_id and a quantity >= 1")
		}
		out.Items = append(out.Items, Item{ProductID: *i.ProductID, Quantity: *i.Quantity})
	}
	return out, nil
}

func fail(w http.ResponseWriter, code int, msg string) {
	w.Header().Set("content-type", "application/json")
	w.WriteHeader(code)
	_ = json.NewEncoder(w).Encode(map[string]any{"code": code, "message": msg})
}

// front is the HTTP front: POST /OrderSaga/{order_id}/place.
func front(c client.Client, taskQueue string) http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("GET /health", func(w http.ResponseWriter, _ *http.Request) { w.WriteHeader(http.StatusOK) })
	mux.HandleFunc("POST /OrderSaga/{order_id}/place", func(w http.ResponseWriter, r *http.Request) {
		orderID := r.PathValue("order_id")
		if !uuidRe.MatchString(orderID) {
			fail(w, http.StatusUnprocessableEntity, "the key must be a UUID (the order id)")
			return
		}
		body, err := io.ReadAll(io.LimitReader(r.Body, 1<<20))
		if err != nil {
			fail(w, http.StatusBadRequest, err.Error())
			return
		}
		input, err := orderInput(orderID, body)
		if err != nil {
			fail(w, http.StatusUnprocessableEntity, err.Error())
			return
		}
		run, err := c.ExecuteWorkflow(r.Context(), client.StartWorkflowOptions{
			ID:                       orderID,
			TaskQueue:                taskQueue,
			WorkflowIDConflictPolicy: enumspb.WORKFLOW_ID_CONFLICT_POLICY_USE_EXISTING,
			WorkflowIDReusePolicy:    enumspb.WORKFLOW_ID_REUSE_POLICY_REJECT_DUPLICATE,
		}, WorkflowName, input)
		if err != nil {
			fail(w, http.StatusBadGateway, "starting the workflow: "+err.Error())
			return
		}
		var result OrderResult
		if err := run.Get(r.Context(), &result); err != nil {
			fail(w, http.StatusBadGateway, "the workflow: "+err.Error())
			return
		}
		w.Header().Set("content-type", "application/json")
		_ = json.NewEncoder(w).Encode(result)
	})
	return mux
}

// tlsConfig is the mutual TLS of the dev stack (libs/mtls): the CA of TLS_CA_FILE, and the
// client certificate TLS_CERT_FILE / TLS_KEY_FILE when set (the peer stands in for the
// order service, so it presents order's). Nil when TLS_CA_FILE is unset: plaintext.
func tlsConfig() *tls.Config {
	caFile := env("TLS_CA_FILE", "")
	if caFile == "" {
		return nil
	}
	pem, err := os.ReadFile(caFile)
	if err != nil {
		log.Fatalf("temporal-peer: TLS_CA_FILE: %v", err)
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(pem) {
		log.Fatalf("temporal-peer: TLS_CA_FILE %s: no certificate", caFile)
	}
	conf := &tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS12}
	if certFile := env("TLS_CERT_FILE", ""); certFile != "" {
		cert, err := tls.LoadX509KeyPair(certFile, env("TLS_KEY_FILE", ""))
		if err != nil {
			log.Fatalf("temporal-peer: TLS_CERT_FILE/TLS_KEY_FILE: %v", err)
		}
		conf.Certificates = []tls.Certificate{cert}
	}
	return conf
}

func dialGRPC(addr string, tc *tls.Config) *grpc.ClientConn {
	creds := insecure.NewCredentials()
	if tc != nil {
		creds = credentials.NewTLS(tc)
	}
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(creds))
	if err != nil {
		log.Fatalf("temporal-peer: %s: %v", addr, err)
	}
	return conn
}

func main() {
	port := env("PEER_PORT", "19090")
	address := env("TEMPORAL_ADDRESS", "127.0.0.1:7233")
	taskQueue := env("TASK_QUEUE", "order-saga")
	inventoryURL := env("INVENTORY_URL", "127.0.0.1:7082")
	paymentURL := env("PAYMENT_URL", "127.0.0.1:7083")
	brokers := env("KAFKA_BROKERS", "127.0.0.1:9092")
	topic := env("TOPIC_PREFIX", "sagaworks") + ".order"

	logger := tlog.NewStructuredLogger(slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn})))
	c, err := client.Dial(client.Options{
		HostPort:  address,
		Namespace: env("TEMPORAL_NAMESPACE", "default"),
		Logger:    logger,
	})
	if err != nil {
		log.Fatalf("temporal-peer: Temporal at %s: %v", address, err)
	}
	defer c.Close()

	tc := tlsConfig()
	activities := &Activities{
		Inventory: inv.NewInventoryServiceClient(dialGRPC(inventoryURL, tc)),
		Payment:   pay.NewPaymentServiceClient(dialGRPC(paymentURL, tc)),
		Topic:     topic,
	}
	if brokers != "" {
		opts := []kgo.Opt{
			kgo.SeedBrokers(strings.Split(brokers, ",")...),
			kgo.AllowAutoTopicCreation(),
			kgo.ClientID("temporal-peer"),
		}
		// The dev stack's SASL_SSL listener: SCRAM-SHA-512 over TLS (the CA of KAFKA_CA_FILE).
		if user := env("KAFKA_SASL_USERNAME", ""); user != "" {
			opts = append(opts, kgo.SASL(scram.Auth{User: user, Pass: env("KAFKA_SASL_PASSWORD", "")}.AsSha512Mechanism()))
		}
		if caFile := env("KAFKA_CA_FILE", ""); caFile != "" {
			pem, err := os.ReadFile(caFile)
			if err != nil {
				log.Fatalf("temporal-peer: KAFKA_CA_FILE: %v", err)
			}
			pool := x509.NewCertPool()
			pool.AppendCertsFromPEM(pem)
			opts = append(opts, kgo.DialTLSConfig(&tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS12}))
		}
		producer, err := kgo.NewClient(opts...)
		if err != nil {
			log.Fatalf("temporal-peer: Kafka at %s: %v", brokers, err)
		}
		defer producer.Close()
		activities.Producer = producer
	}

	// Pollers per task type: the SDK's defaults (2 each) unless WORKFLOW_POLLERS or
	// ACTIVITY_POLLERS say otherwise.
	w := worker.New(c, taskQueue, worker.Options{
		MaxConcurrentWorkflowTaskPollers: envInt("WORKFLOW_POLLERS", 0),
		MaxConcurrentActivityTaskPollers: envInt("ACTIVITY_POLLERS", 0),
	})
	w.RegisterWorkflowWithOptions(OrderSaga, workflowOptions())
	w.RegisterActivity(activities)
	if err := w.Start(); err != nil {
		log.Fatalf("temporal-peer: worker: %v", err)
	}
	defer w.Stop()

	srv := &http.Server{Addr: "127.0.0.1:" + port, Handler: front(c, taskQueue), ReadHeaderTimeout: 10 * time.Second}
	go func() {
		if err := srv.ListenAndServe(); err != nil && !errors.Is(err, http.ErrServerClosed) {
			log.Fatalf("temporal-peer: :%s: %v", port, err)
		}
	}()
	events := "off"
	if brokers != "" {
		events = fmt.Sprintf("%s on %s", topic, brokers)
	}
	log.Printf("temporal-peer: OrderSaga on :%s (Temporal %s, task queue %s), inventory %s, payment %s, events %s",
		port, address, taskQueue, inventoryURL, paymentURL, events)

	stop := make(chan os.Signal, 1)
	signal.Notify(stop, syscall.SIGINT, syscall.SIGTERM)
	<-stop
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	_ = srv.Shutdown(ctx)
}
