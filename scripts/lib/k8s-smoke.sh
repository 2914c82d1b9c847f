# shellcheck shell=bash
# `scripts/k8s smoke`: sagaworks on the cluster, checked the way a user reaches it, after
# `scripts/k8s deploy` (scripts/test-k8s runs both). Sourced by scripts/k8s (STATE,
# KUBECTL, kubectl_, ctr_, import_image, die and say are in scope); the services, their
# databases and whom each calls come from services.toml (scripts/lib/services.sh).
#
#   1. the README's order through the gateway's Service (the local overlay's NodePort on
#      127.0.0.1:30080): CONFIRMED; its events on Kafka, read in the broker's pod as admin;
#      its trace in Jaeger (the query API through its Service)
#   2. the NetworkPolicies, each case tried where it must fail and where it must succeed
#      (a cluster that enforces nothing, or passes nothing, fails):
#        - a pod that no policy admits (its own egress open) reaches the gateway but no
#          backend's gRPC port, Kafka or any database;
#        - each service reaches the services it calls; each backend its own database and
#          Kafka, but not the next backend's database; the gateway no database;
#        - a pod with the gateway's certificate (cert-manager's Secret), admitted to
#          payment's port, gets PERMISSION_DENIED for a method services.toml does not grant
#          the gateway, and an answer of the method for one it does
#   3. a rolling restart of every Deployment, one after another (`kubectl rollout restart`,
#      then `rollout status`), while `sagaworks-tools load` sends orders at a fixed rate
#      through the NodePort: no 5xx and no failed request, then `sagaworks-tools check`
#      (every accepted order final, stock and money balanced, every event on Kafka once)
#
# The host's tools reach the cluster's databases and Kafka as a client in the cluster's
# DNS: `in_cluster_dns` runs a command in a mount namespace whose /etc/resolv.conf names
# CoreDNS (traffic from the node to a pod is not subject to NetworkPolicy, as on every
# cluster: the kubelet's probes come from there). SW_K8S_LOAD_RATE (orders/s, default 15)
# sets the load's rate.

# shellcheck source=scripts/lib/services.sh
. "$ROOT/scripts/lib/services.sh"

SW_K8S_SMOKE_NS=sagaworks-dev
SW_K8S_GATEWAY_URL=http://127.0.0.1:30080
SW_K8S_POLICY_SECS="${SW_K8S_POLICY_SECS:-60}"

ksmoke() { kubectl_ -n "$SW_K8S_SMOKE_NS" "$@"; }

# The value of <key> in the namespace's Secret named <name> or <name>-<hash> (kustomize's
# secretGenerator appends a hash).
sw_k8s_secret() { # name, key
    ksmoke get secrets -o json | python3 -c '
import base64, json, re, sys
name, key = sys.argv[1], sys.argv[2]
for s in json.load(sys.stdin)["items"]:
    if re.fullmatch(re.escape(name) + r"(-[a-z0-9]{10})?", s["metadata"]["name"]) and key in s.get("data", {}):
        sys.stdout.write(base64.b64decode(s["data"][key]).decode())
        sys.exit(0)
sys.exit(f"no Secret {name} with key {key}")' "$1" "$2"
}

in_cluster_dns() { # command...
    # shellcheck disable=SC2016 # expanded by the inner sh
    unshare --mount -- sh -c 'mount --bind "$0" /etc/resolv.conf && exec "$@"' "$SW_K8S_RESOLV" "$@"
}

# The same, replacing the calling (sub)shell: `in_cluster_dns_exec CMD &` makes $! the
# command's own pid, for a signal to reach it.
in_cluster_dns_exec() { # command...
    # shellcheck disable=SC2016 # expanded by the inner sh
    exec unshare --mount -- sh -c 'mount --bind "$0" /etc/resolv.conf && exec "$@"' "$SW_K8S_RESOLV" "$@"
}

# --- 1. the README's order ----------------------------------------------------------------

sw_k8s_smoke_order() {
    local admin product customer token order_json order_id status trace types got want spans
    say "the README's order, through the gateway's NodePort at $SW_K8S_GATEWAY_URL"
    api() { # token, curl args...
        local t="$1"
        shift
        curl -sS --fail-with-body -H "authorization: Bearer $t" -H 'content-type: application/json' "$@"
    }
    admin="$("$SW_BIN/mint-token" --sub ops --role admin)"
    product="$(api "$admin" "$SW_K8S_GATEWAY_URL/v1/products" -d '{"sku":"mug","name":"Mug","price_cents":1200,"initial_stock":5}' | jq -er .id)"
    customer="$(api "$admin" "$SW_K8S_GATEWAY_URL/v1/customers" -d '{"name":"Ada","initial_credit_cents":5000}' | jq -er .customer_id)"
    token="$("$SW_BIN/mint-token" --sub "$customer")"
    order_json="$(api "$token" "$SW_K8S_GATEWAY_URL/v1/orders" -H 'Idempotency-Key: first-order' \
        -d "{\"customer_id\":\"$customer\",\"items\":[{\"product_id\":\"$product\",\"quantity\":2}]}")"
    order_id="$(jq -er '.id // .order_id' <<<"$order_json")"
    status="$(jq -er .status <<<"$order_json")"
    trace="$(jq -er .trace_id <<<"$order_json")"
    [ "$status" = CONFIRMED ] || die "the README's order is $status, not CONFIRMED: $order_json"
    say "order $order_id CONFIRMED (trace $trace)"

    say "its events on sagaworks.order (kafka-console-consumer in the broker's pod, as admin)"
    # The reader exits 5 s after the last message it got; the loop reads again until both
    # events are there.
    types=""
    for _ in $(seq 1 15); do
        types="$(ksmoke exec kafka-0 -- /opt/kafka/bin/kafka-console-consumer.sh \
            --bootstrap-server kafka-0.kafka-headless.$SW_K8S_SMOKE_NS.svc:9092 \
            --consumer.config /tmp/sagaworks-kafka/admin.properties --topic sagaworks.order \
            --from-beginning --timeout-ms 5000 --property print.key=true --property print.headers=true \
            --property key.separator=' | ' --property headers.separator=',' 2>/dev/null |
            grep -F "| $order_id |" | grep -o 'ce_type:[A-Za-z]*' | cut -d: -f2 | paste -sd' ' || true)"
        case "$types" in *OrderConfirmed*) break ;; esac
        sleep 2
    done
    [ "$types" = "OrderCreated OrderConfirmed" ] ||
        die "the order's events on sagaworks.order are '$types', not 'OrderCreated OrderConfirmed'"
    say "sagaworks.order, key $order_id: $types"

    say "its trace in Jaeger (jaeger:16686/api/v3/traces/$trace)"
    want="$(sw_services | sort | paste -sd' ')"
    got=""
    for _ in $(seq 1 30); do
        if in_cluster_dns curl -sf "http://jaeger.$SW_K8S_SMOKE_NS.svc:16686/api/v3/traces/$trace" >"$SW_K8S_WORK/trace.json"; then
            got="$(jq -r '[.result.resourceSpans[].resource.attributes[] | select(.key == "service.name") | .value.stringValue] | unique | join(" ")' "$SW_K8S_WORK/trace.json")"
            [ "$got" = "$want" ] && break
        fi
        sleep 2
    done
    [ "$got" = "$want" ] || die "the trace has spans of '$got', not of every service ($want)"
    spans="$(jq '[.result.resourceSpans[].scopeSpans[].spans[]] | length' "$SW_K8S_WORK/trace.json")"
    say "trace $trace: $spans spans of $got"
    SW_K8S_SUMMARY+=("order CONFIRMED, events '$types', a trace of $spans spans over $(wc -w <<<"$got") services")
}

# --- 2. the NetworkPolicies ---------------------------------------------------------------

# The probe pods: `intruder`, which no policy of the system admits (its own egress opened by
# a policy of the test, so that only the targets' policies stand in its way), and
# `cert-gateway`, labelled as the gateway (so the policies admit it where they admit the
# gateway) with the gateway's certificate mounted; it has no port named `http`, so the
# gateway's Service never sends it traffic. Both meet the namespace's "restricted" standard.
sw_k8s_smoke_probe_pods() {
    local pod labels volume mount
    cat <<YAML
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata:
  name: smoke-intruder-egress
  labels: {app.kubernetes.io/part-of: sagaworks-smoke}
spec:
  podSelector:
    matchLabels: {app.kubernetes.io/name: smoke-intruder}
  policyTypes: [Egress]
  egress:
    - {}
YAML
    for pod in intruder cert-gateway; do
        if [ "$pod" = intruder ]; then
            labels="{app.kubernetes.io/name: smoke-intruder, app.kubernetes.io/part-of: sagaworks-smoke}"
            volume="" mount=""
        else
            labels="{app.kubernetes.io/name: gateway, app.kubernetes.io/component: smoke-probe, app.kubernetes.io/part-of: sagaworks-smoke}"
            volume="  volumes:
    - name: tls
      secret: {secretName: gateway-tls}"
            mount="      volumeMounts:
        - {name: tls, mountPath: /tls, readOnly: true}"
        fi
        cat <<YAML
---
apiVersion: v1
kind: Pod
metadata:
  name: smoke-$pod
  labels: $labels
spec:
  automountServiceAccountToken: false
  terminationGracePeriodSeconds: 1
  securityContext:
    runAsNonRoot: true
    runAsUser: 10001
    runAsGroup: 10001
    seccompProfile: {type: RuntimeDefault}
  containers:
    - name: probe
      image: $SW_K8S_PROBE_IMAGE
      imagePullPolicy: Never
      args: [serve, "8080"]
      securityContext:
        allowPrivilegeEscalation: false
        readOnlyRootFilesystem: true
        capabilities: {drop: [ALL]}
$mount
$volume
YAML
    done
}

# One attempt of a case: prints `reaches` or `blocked`, or nothing when the attempt itself
# failed (kubectl exec refused, the pod not there yet): an exec that fails is not a
# connection that was blocked. The probe pods run `/probe tcp`, whose refusal names the dial;
# the services' containers their own bash.
sw_k8s_smoke_tcp_once() { # from, host:port
    local from="$1" target="$2" out
    case "$from" in
    smoke-*)
        if out="$(ksmoke exec "$from" -- /probe tcp "$target" 3s 2>&1)"; then echo reaches
        elif [[ $out == *"dial tcp"* ]]; then echo blocked
        fi ;;
    *)
        ksmoke exec "$from" -c "${from#deploy/}" -- bash -c \
            "if timeout 3 bash -c 'exec 3<>/dev/tcp/${target%:*}/${target#*:}' 2>/dev/null; then echo reaches; else echo blocked; fi" \
            2>/dev/null | tail -n 1 ;;
    esac
}

# One case: <from> (a probe pod `smoke-...`, or `deploy/<name>`) connects to <host:port>;
# <want> is `reaches` or `blocked`. It retries until the expected outcome or
# SW_K8S_POLICY_SECS (policies and new pods reach the enforcer asynchronously); the opposite
# outcome at the deadline, or no outcome at all, fails. Prints the case's line.
sw_k8s_smoke_tcp() { # from, host:port, want
    local from="$1" target="$2" want="$3" deadline=$((SECONDS + SW_K8S_POLICY_SECS)) got
    while :; do
        got="$(sw_k8s_smoke_tcp_once "$from" "$target")"
        [ "$got" = "$want" ] && break
        [ $SECONDS -lt "$deadline" ] || die "NetworkPolicy: $from -> $target ${got:-no answer (kubectl exec failed)}, want $want"
        sleep 1
    done
    printf '%-26s -> %-20s %s\n' "$from" "$target" "$got"
}

# The cases run side by side (a blocked one waits out its 3 s dial): each in a subshell of
# its own, its line in a file; then every one must have passed.
SW_K8S_CASE_PIDS=()
sw_k8s_smoke_case() { # from, host:port, want
    local n=${#SW_K8S_CASE_PIDS[@]}
    sw_k8s_smoke_tcp "$@" >"$SW_K8S_WORK/case-$(printf '%03d' "$n")" &
    SW_K8S_CASE_PIDS+=($!)
}
sw_k8s_smoke_cases_wait() {
    local pid failed=0 f
    for pid in "${SW_K8S_CASE_PIDS[@]}"; do wait "$pid" || failed=$((failed + 1)); done
    [ "$failed" = 0 ] || die "NetworkPolicy: $failed of ${#SW_K8S_CASE_PIDS[@]} cases failed (above)"
    for f in "$SW_K8S_WORK"/case-*; do SW_K8S_POLICY_CASES+=("$(cat "$f")"); done
    rm -f "$SW_K8S_WORK"/case-*
    SW_K8S_CASE_PIDS=()
}

sw_k8s_smoke_policies() {
    local svc out
    say "NetworkPolicies: probe pods (image $SW_K8S_PROBE_IMAGE)"
    ctr_ images ls -q | grep -qx "$SW_K8S_PROBE_IMAGE" || import_image "$(sw_k8s_probe_image)/image.tar"
    sw_k8s_smoke_probe_pods | ksmoke apply -f - >/dev/null
    ksmoke wait --for=condition=Ready pod/smoke-intruder pod/smoke-cert-gateway --timeout=120s >/dev/null ||
        die "the probe pods are not Ready"

    # The cases follow services.toml: its services, their databases and whom each calls.
    local dbs=() callee caller i
    mapfile -t dbs < <(sw_db_services)
    # A pod no policy admits: its egress works (the gateway admits anyone), yet the backends'
    # gRPC ports, Kafka and the databases refuse it.
    sw_k8s_smoke_case smoke-intruder "gateway:$(sw_port gateway http)" reaches
    for svc in $(sw_backends); do sw_k8s_smoke_case smoke-intruder "$svc:$(sw_port "$svc" grpc)" blocked; done
    sw_k8s_smoke_case smoke-intruder kafka:9092 blocked
    for svc in "${dbs[@]}"; do sw_k8s_smoke_case smoke-intruder "$svc-db:5432" blocked; done
    # Where the same targets must answer: their own clients. Each service reaches what it
    # calls, Kafka and its own database, and not the next service's database.
    for caller in $(sw_services); do
        for callee in $(sw_calls "$caller"); do
            sw_k8s_smoke_case "deploy/$caller" "$callee:$(sw_port "$callee" grpc)" reaches
        done
    done
    for i in "${!dbs[@]}"; do
        svc="${dbs[$i]}"
        sw_k8s_smoke_case "deploy/$svc" kafka:9092 reaches
        sw_k8s_smoke_case "deploy/$svc" "$svc-db:5432" reaches
        [ ${#dbs[@]} -lt 2 ] || sw_k8s_smoke_case "deploy/$svc" "${dbs[$(((i + 1) % ${#dbs[@]}))]}-db:5432" blocked
    done
    # The gateway: no database.
    for svc in "${dbs[@]}"; do sw_k8s_smoke_case deploy/gateway "$svc-db:5432" blocked; done

    sw_k8s_smoke_case smoke-cert-gateway payment:7083 reaches
    sw_k8s_smoke_cases_wait

    # A valid certificate does not grant every method: the gateway's, on payment (whose port
    # it reaches: the last case above).
    out="$(ksmoke exec smoke-cert-gateway -- /probe grpc https://payment:7083/sagaworks.payment.v1.PaymentService/Charge /tls 10s 2>&1)" ||
        die "mTLS: the gateway's certificate calling PaymentService/Charge got no gRPC status: $out"
    case "$out" in "grpc-status 7 "*) ;; *) die "mTLS: the gateway calling PaymentService/Charge (not granted) got '$out', want PERMISSION_DENIED (7)" ;; esac
    SW_K8S_POLICY_CASES+=("$(printf '%-26s -> %-20s %s' "gateway's certificate" "Payment/Charge" "refused: ${out:0:60}")")
    out="$(ksmoke exec smoke-cert-gateway -- /probe grpc https://payment:7083/sagaworks.payment.v1.PaymentService/GetAccount /tls 10s 2>&1)" ||
        die "mTLS: the gateway's certificate calling PaymentService/GetAccount got no gRPC status: $out"
    case "$out" in "grpc-status 7 "* | "grpc-status 14 "*) die "mTLS: the gateway calling PaymentService/GetAccount (granted) got '$out'" ;; esac
    SW_K8S_POLICY_CASES+=("$(printf '%-26s -> %-20s %s' "gateway's certificate" "Payment/GetAccount" "passes the allow-list: ${out:0:50}")")

    ksmoke delete networkpolicy,pod -l app.kubernetes.io/part-of=sagaworks-smoke --wait=true >/dev/null
    say "NetworkPolicies and the allow-list: ${#SW_K8S_POLICY_CASES[@]} cases as they must be"
}

# --- 3. a rolling restart of every Deployment under load ----------------------------------

sw_k8s_smoke_rollout() {
    local deploy old_pods load_pid started t0 rate="${SW_K8S_LOAD_RATE:-15}" bad accepted sent resent
    sw_k8s_secret kafka-ca ca.crt >"$SW_K8S_WORK/kafka-ca.pem"

    "$SW_BIN/sagaworks-tools" seed --api "$SW_K8S_GATEWAY_URL" --out "$SW_K8S_WORK/fixture.json" \
        --products 20 --customers 20 --poor-customers 4 --poor-credit-cents 3000 >/dev/null
    say "orders at $rate/s through $SW_K8S_GATEWAY_URL while every Deployment restarts, one after another"
    in_cluster_dns_exec "$SW_BIN/sagaworks-tools" load --api "$SW_K8S_GATEWAY_URL" --fixture "$SW_K8S_WORK/fixture.json" \
        --rate "$rate" --duration-secs 1800 "${SW_K8S_PG[@]:0:2}" --accepted-out "$SW_K8S_WORK/accepted.txt" \
        >"$SW_K8S_WORK/load.txt" 2>&1 &
    load_pid=$!
    sleep 5
    started=$SECONDS
    for deploy in $(ksmoke get deployments -o name); do
        t0=$SECONDS
        old_pods="$(ksmoke get pods -l "app.kubernetes.io/name=${deploy#*/}" -o name | grep -v smoke || true)"
        ksmoke rollout restart "$deploy" >/dev/null
        # Rolled out, and the old pods gone: each one's preStop and drain happen under load.
        # shellcheck disable=SC2086 # one argument per pod
        if ! ksmoke rollout status "$deploy" --timeout=300s >/dev/null ||
            ! ksmoke wait --for=delete $old_pods --timeout=120s >/dev/null 2>&1; then
            kill "$load_pid" 2>/dev/null || true
            die "$deploy did not roll out, or its old pods did not go, within 300s + 120s"
        fi
        SW_K8S_SUMMARY+=("$(printf 'rollout restart %-28s %4ss' "$deploy" $((SECONDS - t0)))")
        say "${SW_K8S_SUMMARY[-1]}"
    done
    # A few seconds more: requests on the last pods' connections drain.
    sleep 5
    kill -TERM "$load_pid"
    wait "$load_pid" || { cat "$SW_K8S_WORK/load.txt" >&2; die "the load tool failed"; }
    cat "$SW_K8S_WORK/load.txt" >&2
    # Any 5xx, or a request that got no answer at all, fails the rollout. A request whose
    # connection ended unanswered is sent once more with its Idempotency-Key (the load
    # tool's `Orders::place_order`): counted and reported, not a failure when answered.
    bad="$(grep -oE 'rejected \{[^}]*\}|failed \{[^}]*\}' "$SW_K8S_WORK/load.txt" | grep -E '\b5[0-9]{2}:|failed \{.+\}' || true)"
    [ -z "$bad" ] || die "requests failed during the rolling restart: $bad"
    accepted="$(wc -l <"$SW_K8S_WORK/accepted.txt")"
    sent="$(awk '$1 ~ /^[0-9.]+$/ && $2 ~ /^[0-9]+$/ {print $2; exit}' "$SW_K8S_WORK/load.txt")"
    resent="$(sed -n 's/.*sent again after their connection ended unanswered.*: \([0-9]*\)$/\1/p' "$SW_K8S_WORK/load.txt")"
    say "the check tool's invariants"
    SW_KAFKA_USER=admin SW_KAFKA_PASSWORD="$(sw_k8s_secret kafka-admin password)" SW_KAFKA_CA_FILE="$SW_K8S_WORK/kafka-ca.pem" \
        in_cluster_dns "$SW_BIN/sagaworks-tools" check --fixture "$SW_K8S_WORK/fixture.json" \
        --accepted "$SW_K8S_WORK/accepted.txt" "${SW_K8S_PG[@]}" --settle-secs 180 \
        --brokers "kafka.$SW_K8S_SMOKE_NS.svc:9092" --topic-prefix sagaworks --min-accepted 50 --min-confirmed 20 \
        >"$SW_K8S_WORK/check.txt" 2>&1 || { cat "$SW_K8S_WORK/check.txt" >&2; die "an invariant failed after the rolling restart"; }
    cat "$SW_K8S_WORK/check.txt" >&2
    SW_K8S_SUMMARY+=("rolling restart of every Deployment in $((SECONDS - started))s under $rate orders/s: $sent requests (${resent:-0} sent again after their connection ended unanswered), no 5xx, $accepted orders accepted, all final, invariants held")
}

sw_k8s_smoke() {
    local started=$SECONDS
    command -v unshare >/dev/null || die "unshare is missing (util-linux)"
    command -v jq >/dev/null || die "jq is missing"
    { [ -x "$SW_BIN/mint-token" ] && [ -x "$SW_BIN/sagaworks-tools" ]; } ||
        die "no $SW_BIN/mint-token or sagaworks-tools (SW_BIN: the workspace's debug build)"
    SW_K8S_WORK="$(mktemp -d)"
    # shellcheck disable=SC2064 # the path, now
    trap "rm -rf '$SW_K8S_WORK'" RETURN
    SW_K8S_RESOLV="$SW_K8S_WORK/resolv.conf"
    printf 'nameserver %s\nsearch %s.svc.cluster.local svc.cluster.local cluster.local\noptions ndots:5\n' \
        "$(kubectl_ -n kube-system get service kube-dns -o jsonpath='{.spec.clusterIP}')" "$SW_K8S_SMOKE_NS" >"$SW_K8S_RESOLV"
    export APP_AUTH__JWT_SECRET SW_JWT_SECRET
    APP_AUTH__JWT_SECRET="$(sw_k8s_secret gateway-auth jwt-secret)"
    SW_JWT_SECRET="$APP_AUTH__JWT_SECRET"
    SW_K8S_SUMMARY=() SW_K8S_POLICY_CASES=()
    # Each service's database has a server of its own; --pg-admin names order's.
    local password svc
    password="$(sw_k8s_secret postgres-superuser password)"
    SW_K8S_PG=(--pg-admin "postgres://postgres:$password@order-db.$SW_K8S_SMOKE_NS.svc:5432/postgres")
    for svc in $(sw_db_services); do
        SW_K8S_PG+=(--pg-server "$svc=postgres://postgres:$password@$svc-db.$SW_K8S_SMOKE_NS.svc:5432/postgres")
    done

    # The relays delete what they publish: the ledger keeps every outbox row from now on, for
    # the check to compare with Kafka.
    in_cluster_dns "$SW_BIN/sagaworks-tools" ledger "${SW_K8S_PG[@]}" >/dev/null || die "installing the outbox ledger failed"

    sw_k8s_smoke_order
    sw_k8s_smoke_policies
    sw_k8s_smoke_rollout

    printf '\n==> Kubernetes smoke test passed in %ss\n' $((SECONDS - started)) >&2
    printf '    %s\n' "${SW_K8S_SUMMARY[@]}" >&2
    printf '    NetworkPolicy and allow-list cases:\n' >&2
    printf '      %s\n' "${SW_K8S_POLICY_CASES[@]}" >&2
}
