// The order saga of sagaworks (services/order/src/saga.rs), orchestrated by Restate instead of
// the saga library: the peer of `scripts/bench-peer`.
//
//   reserve_stock ──ok──> charge_payment ──ok──> confirm_order ──> CONFIRMED
//        │                     │
//    rejected: CANCELLED   rejected ──────────────────┐
//    failed ─────────┐     failed ──> refund_payment ──> release_stock ──> CANCELLED
//                    └──────────────────────────────────────────^
//
// One Restate virtual object, `OrderSaga`, keyed by the order id; its handler `place` takes the
// body of the gateway's `POST /v1/orders` ({customer_id, items: [{product_id, quantity}]}) and
// answers when the saga finished: {order_id, status: "CONFIRMED" | "CANCELLED", total_cents,
// failure_reason}. Every side effect is a `ctx.run` (journaled by Restate: a retry or a crash
// replays its result instead of calling again). The participants are the same inventory and
// payment services over gRPC (proto/), called exactly as the order service calls them:
// idempotency key `<saga_id>:<step>`, reservation and payment ids = the saga id, 2 s per attempt,
// up to 3 attempts for a forward step, compensations retried until done.
//
// Confirm: the order (customer, lines, status, total, reason) is Restate state of the object
// (where sagaworks writes its orders table), and the saga publishes OrderConfirmed (v2) or
// OrderCancelled (v1) on the `<prefix>.order` topic with the CloudEvents headers the outbox relay
// writes, so inventory's consumer commits the stock (`reserved` -> `sold`) as it does for
// sagaworks. The event id is drawn from Restate's deterministic random: a replayed publish sends
// the same id, which inventory's inbox dedupes.
//
// Environment: PEER_PORT (9080), INVENTORY_URL (127.0.0.1:7082), PAYMENT_URL (127.0.0.1:7083),
// KAFKA_BROKERS (127.0.0.1:9092; empty: publish nothing), TOPIC_PREFIX (sagaworks),
// PROTO_DIR (../../proto from this file).

import "./node20.mjs";
import * as restate from "@restatedev/restate-sdk";
import grpc from "@grpc/grpc-js";
import protoLoader from "@grpc/proto-loader";
import kafkajs from "kafkajs";
import path from "node:path";
import { fileURLToPath } from "node:url";

const here = path.dirname(fileURLToPath(import.meta.url));
const env = (name, fallback) => process.env[name] ?? fallback;
const PORT = Number(env("PEER_PORT", "9080"));
const PROTO_DIR = env("PROTO_DIR", path.resolve(here, "../../../proto"));
const TOPIC = `${env("TOPIC_PREFIX", "sagaworks")}.order`;
const BROKERS = env("KAFKA_BROKERS", "127.0.0.1:9092");

/// Per-attempt deadline of a participant call (the resilience stack's `timeout_ms`).
const ATTEMPT_MS = 2_000;
/// Forward steps: attempts before giving up and compensating (the stack's `retry.max_attempts`).
const FORWARD = { maxRetryAttempts: 3, initialRetryInterval: 50, maxRetryInterval: 1_000 };
/// Compensations and the confirmation: retried until done (Restate's default), backoff capped.
const UNTIL_DONE = { initialRetryInterval: 50, maxRetryInterval: 5_000 };

// ---- gRPC clients of the participants -------------------------------------------------------

function load(file) {
    const def = protoLoader.loadSync(path.join(PROTO_DIR, file), {
        keepCase: true,
        longs: Number,
        enums: String,
        defaults: true,
        includeDirs: [PROTO_DIR],
    });
    return grpc.loadPackageDefinition(def);
}

const inventoryPkg = load("inventory.proto").sagaworks.inventory.v1;
const paymentPkg = load("payment.proto").sagaworks.payment.v1;
const inventory = new inventoryPkg.InventoryService(
    env("INVENTORY_URL", "127.0.0.1:7082"),
    grpc.credentials.createInsecure(),
);
const payment = new paymentPkg.PaymentService(env("PAYMENT_URL", "127.0.0.1:7083"), grpc.credentials.createInsecure());

/// Answers the participants give for a business refusal (libs/saga/src/grpc.rs: `Rejected`):
/// final, not retried. Anything else may be a transport problem and is retried.
const REJECTIONS = new Set([
    grpc.status.INVALID_ARGUMENT,
    grpc.status.NOT_FOUND,
    grpc.status.FAILED_PRECONDITION,
    grpc.status.ABORTED,
    grpc.status.ALREADY_EXISTS,
    grpc.status.OUT_OF_RANGE,
    grpc.status.PERMISSION_DENIED,
    grpc.status.UNAUTHENTICATED,
]);

/// One unary call with the per-attempt deadline; resolves to {ok} or {rejected: reason}, and
/// throws (so `ctx.run` retries) on anything that is not a business answer.
function call(client, method, request, step) {
    return new Promise((resolve, reject) => {
        client[method](request, { deadline: Date.now() + ATTEMPT_MS }, (err, response) => {
            if (!err) return resolve({ ok: response });
            const reason = `${step}: ${err.details || err.message}`;
            if (REJECTIONS.has(err.code)) return resolve({ rejected: reason });
            reject(new Error(reason));
        });
    });
}

/// A compensation: a refusal is no success (it is retried until done, like the saga library's).
async function undo(client, method, request, step) {
    const answer = await call(client, method, request, step);
    if (answer.rejected) throw new Error(answer.rejected);
}

// ---- the order events, as the outbox relay writes them ----------------------------------------

const kafka = BROKERS ? new kafkajs.Kafka({ clientId: "restate-peer", brokers: BROKERS.split(","), logLevel: kafkajs.logLevel.WARN }) : null;
const producer = kafka?.producer({ allowAutoTopicCreation: true });
let connected = null;

/// Publishes `payload` as event `type`/`version` of order `orderId`, with id `eventId`.
async function publish(type, version, orderId, eventId, payload) {
    if (!producer) return;
    connected ??= producer.connect();
    await connected;
    const headers = {
        ce_id: eventId,
        ce_type: type,
        ce_source: "/sagaworks/order",
        ce_specversion: "1.0",
        ce_time: new Date().toISOString(),
        ce_schemaversion: String(version),
        ce_aggregateid: orderId,
        "content-type": "application/json",
        ce_dataschema: `urn:sagaworks:event:${type}:v${version}`,
    };
    await producer.send({ topic: TOPIC, acks: -1, messages: [{ key: orderId, value: JSON.stringify(payload), headers }] });
}

// ---- the saga ---------------------------------------------------------------------------------

const UUID = /^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$/i;

/// The gateway's body, checked as far as the peer needs (the participants check the rest).
function orderInput(body) {
    const bad = (why) => new restate.TerminalError(why, { errorCode: 422 });
    if (!body || typeof body !== "object") throw bad("the body must be an order");
    const { customer_id, items } = body;
    if (typeof customer_id !== "string" || !UUID.test(customer_id)) throw bad("customer_id must be a UUID");
    if (!Array.isArray(items) || items.length === 0 || items.length > 100) throw bad("items: 1 to 100 lines");
    for (const i of items) {
        if (typeof i?.product_id !== "string" || !Number.isInteger(i?.quantity) || i.quantity < 1) {
            throw bad("each item needs a product_id and a quantity >= 1");
        }
    }
    return { customer_id, items: items.map((i) => ({ product_id: i.product_id, quantity: i.quantity })) };
}

const orderSaga = restate.object({
    name: "OrderSaga",
    handlers: {
        /// Places the order keyed by the object's key and runs its saga to the end.
        place: async (ctx, body) => {
            const orderId = ctx.key;
            if (!UUID.test(orderId)) throw new restate.TerminalError("the key must be a UUID (the order id)", { errorCode: 422 });
            const done = await ctx.get("order");
            if (done && done.status !== "PENDING") return done; // placed before: its answer again
            const input = orderInput(body);
            const sagaId = ctx.rand.uuidv4();
            const key = (step) => `${sagaId}:${step}`;
            const order = { order_id: orderId, customer_id: input.customer_id, items: input.items, status: "PENDING", total_cents: 0, failure_reason: null };
            ctx.set("order", order);

            const end = async (status, reason) => {
                order.status = status;
                order.failure_reason = reason;
                ctx.set("order", order);
                const eventId = ctx.rand.uuidv4();
                if (status === "CONFIRMED") {
                    const confirmed = { order_id: orderId, customer_id: input.customer_id, saga_id: sagaId, reservation_ids: [sagaId], payment_id: sagaId, total_cents: order.total_cents };
                    await ctx.run("confirm_order", () => publish("OrderConfirmed", 2, orderId, eventId, confirmed), UNTIL_DONE);
                } else {
                    const cancelled = { order_id: orderId, customer_id: input.customer_id, saga_id: sagaId, reservation_id: sagaId, payment_id: sagaId, total_cents: order.total_cents, reason };
                    await ctx.run("cancel_order", () => publish("OrderCancelled", 1, orderId, eventId, cancelled), UNTIL_DONE);
                }
                return { order_id: orderId, status, total_cents: order.total_cents, failure_reason: reason };
            };
            const releaseStock = (reason) =>
                ctx.run(
                    "release_stock",
                    () => undo(inventory, "ReleaseReservation", { idempotency_key: key("release_stock"), reservation_id: sagaId, order_id: orderId, reason }, "release_stock"),
                    UNTIL_DONE,
                );
            const refundPayment = (reason) =>
                ctx.run(
                    "refund_payment",
                    () => undo(payment, "Refund", { idempotency_key: key("refund_payment"), payment_id: sagaId, order_id: orderId, reason }, "refund_payment"),
                    UNTIL_DONE,
                );
            /// A forward step: {ok} or {rejected}; {failed} once its attempts ran out (it may have happened).
            const forward = async (step, action) => {
                try {
                    return await ctx.run(step, action, FORWARD);
                } catch (e) {
                    if (e instanceof restate.TerminalError) return { failed: `${step}: ${e.message}` };
                    throw e;
                }
            };

            const reserved = await forward("reserve_stock", async () => {
                const request = {
                    idempotency_key: key("reserve_stock"),
                    reservation_id: sagaId,
                    order_id: orderId,
                    items: input.items,
                };
                const answer = await call(inventory, "ReserveStock", request, "reserve_stock");
                return answer.ok ? { ok: { total_cents: answer.ok.total_cents } } : answer;
            });
            if (reserved.rejected) return end("CANCELLED", reserved.rejected);
            if (reserved.failed) {
                await releaseStock(reserved.failed);
                return end("CANCELLED", reserved.failed);
            }
            order.total_cents = reserved.ok.total_cents;
            ctx.set("order", order);

            const charged = await forward("charge_payment", async () => {
                const request = {
                    idempotency_key: key("charge_payment"),
                    payment_id: sagaId,
                    customer_id: input.customer_id,
                    order_id: orderId,
                    amount_cents: order.total_cents,
                };
                const answer = await call(payment, "Charge", request, "charge_payment");
                return answer.ok ? { ok: true } : answer;
            });
            if (charged.rejected) {
                await releaseStock(charged.rejected);
                return end("CANCELLED", charged.rejected);
            }
            if (charged.failed) {
                // A charge that timed out may have happened: refunded.
                await refundPayment(charged.failed);
                await releaseStock(charged.failed);
                return end("CANCELLED", charged.failed);
            }
            return end("CONFIRMED", null);
        },
    },
});

const port = await restate.endpoint().bind(orderSaga).listen(PORT);
console.log(`restate-peer: OrderSaga on :${port}, inventory ${env("INVENTORY_URL", "127.0.0.1:7082")}, payment ${env("PAYMENT_URL", "127.0.0.1:7083")}, events ${BROKERS ? `${TOPIC} on ${BROKERS}` : "off"}`);
for (const signal of ["SIGINT", "SIGTERM"]) {
    process.on(signal, async () => {
        await producer?.disconnect().catch(() => {});
        process.exit(0);
    });
}
