# shellcheck shell=bash
# `scripts/k8s selftest`: what the cluster of scripts/k8s must do for the system's manifests,
# tried on a running cluster (scripts/k8s up) in a namespace of its own, removed afterwards.
#
#   1. a server pod and two client pods (image sagaworks.local/k8s-probe, built here and
#      imported into the cluster's containerd) become Ready;
#   2. a client reaches the server through a ClusterIP Service by its DNS name
#      (CoreDNS, kube-proxy, the bridge);
#   3. after a default-deny ingress NetworkPolicy, the same request fails;
#   4. after a policy admitting pods labelled role=client to the server's port, the client
#      gets through again while the other pod (role=other) still does not.
#
# Each policy takes effect asynchronously (kube-network-policies watches the API), so steps 3
# and 4 retry the request until the expected outcome, for at most SW_K8S_POLICY_SECS
# (default 30) seconds; the opposite outcome at the deadline fails the test. Sourced by
# scripts/k8s, which defines STATE, KUBECTL, kubectl_, ctr_, import_image, die and say.

SW_K8S_SELFTEST_NS=sw-selftest

sw_k8s_selftest_manifest() {
    cat <<YAML
apiVersion: v1
kind: Namespace
metadata:
  name: $SW_K8S_SELFTEST_NS
---
apiVersion: v1
kind: Service
metadata:
  name: server
  namespace: $SW_K8S_SELFTEST_NS
spec:
  selector: {role: server}
  ports:
    - {name: http, port: 80, targetPort: 8080}
YAML
    local pod role
    for pod in server client other; do
        role="$pod"
        cat <<YAML
---
apiVersion: v1
kind: Pod
metadata:
  name: $pod
  namespace: $SW_K8S_SELFTEST_NS
  labels: {role: $role}
spec:
  terminationGracePeriodSeconds: 2
  containers:
    - name: probe
      image: $SW_K8S_PROBE_IMAGE
      imagePullPolicy: Never
      args: [serve, "8080"]
      ports:
        - {containerPort: 8080}
      readinessProbe:
        httpGet: {path: /, port: 8080}
        periodSeconds: 1
      securityContext:
        allowPrivilegeEscalation: false
        readOnlyRootFilesystem: true
        runAsNonRoot: true
        runAsUser: 65534
        capabilities: {drop: [ALL]}
YAML
    done
}

SW_K8S_DENY_ALL="apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata:
  name: default-deny-ingress
  namespace: $SW_K8S_SELFTEST_NS
spec:
  podSelector: {}
  policyTypes: [Ingress]"

SW_K8S_ALLOW_CLIENT="apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata:
  name: server-from-client
  namespace: $SW_K8S_SELFTEST_NS
spec:
  podSelector:
    matchLabels: {role: server}
  policyTypes: [Ingress]
  ingress:
    - from:
        - podSelector:
            matchLabels: {role: client}
      ports:
        - {protocol: TCP, port: 8080}"

SW_K8S_SELFTEST_URL="http://server.$SW_K8S_SELFTEST_NS.svc.cluster.local/"
SW_K8S_PASSED=0
SW_K8S_FAILED=0

# One GET of the Service from pod $1; prints what the probe said.
sw_k8s_selftest_get() { # pod
    kubectl_ -n "$SW_K8S_SELFTEST_NS" exec "$1" -- /probe get "$SW_K8S_SELFTEST_URL" 2s 2>&1
}

# Retries until the request from pod $1 succeeds ($2 = reach) or fails ($2 = blocked),
# for at most SW_K8S_POLICY_SECS; records the case as passed or failed.
sw_k8s_selftest_expect() { # pod, reach|blocked, description
    local pod="$1" want="$2" what="$3" out rc deadline=$((SECONDS + ${SW_K8S_POLICY_SECS:-30}))
    while :; do
        rc=0
        out="$(sw_k8s_selftest_get "$pod")" || rc=$?
        if { [ "$want" = reach ] && [ $rc = 0 ]; } || { [ "$want" = blocked ] && [ $rc != 0 ]; }; then
            printf 'PASS  %s: %s\n' "$what" "$(echo "$out" | head -n 1)"
            SW_K8S_PASSED=$((SW_K8S_PASSED + 1))
            return 0
        fi
        if [ $SECONDS -ge $deadline ]; then
            printf 'FAIL  %s: expected %s after %ss, got: %s\n' "$what" "$want" "${SW_K8S_POLICY_SECS:-30}" "$out"
            SW_K8S_FAILED=$((SW_K8S_FAILED + 1))
            return 1
        fi
        sleep 0.5
    done
}

sw_k8s_selftest() {
    local image started=$SECONDS
    if ! pid_of kube-apiserver >/dev/null || ! pid_of kubelet >/dev/null; then
        die "the cluster does not run (scripts/k8s up)"
    fi
    image="$(sw_k8s_probe_image)" || die "building the selftest image failed (see above)"
    ctr_ images ls -q | grep -qx "$SW_K8S_PROBE_IMAGE" || import_image "$image/image.tar"
    kubectl_ delete namespace "$SW_K8S_SELFTEST_NS" --ignore-not-found --wait=true --timeout=60s >/dev/null
    sw_k8s_selftest_manifest | kubectl_ apply -f - >/dev/null
    if ! kubectl_ -n "$SW_K8S_SELFTEST_NS" wait --for=condition=Ready pod/server pod/client pod/other --timeout=90s >/dev/null; then
        kubectl_ -n "$SW_K8S_SELFTEST_NS" describe pods >&2
        die "the selftest's pods did not become Ready in 90s"
    fi
    say "pods Ready: $(kubectl_ -n "$SW_K8S_SELFTEST_NS" get pods -o jsonpath='{range .items[*]}{.metadata.name}={.status.podIP} {end}')"

    sw_k8s_selftest_expect client reach "no policy: client -> $SW_K8S_SELFTEST_URL" || true
    sw_k8s_selftest_expect other reach "no policy: other -> $SW_K8S_SELFTEST_URL" || true
    echo "$SW_K8S_DENY_ALL" | kubectl_ apply -f - >/dev/null
    sw_k8s_selftest_expect client blocked "default-deny ingress: client -> server" || true
    sw_k8s_selftest_expect other blocked "default-deny ingress: other -> server" || true
    echo "$SW_K8S_ALLOW_CLIENT" | kubectl_ apply -f - >/dev/null
    sw_k8s_selftest_expect client reach "default-deny + allow role=client: client -> server" || true
    sw_k8s_selftest_expect other blocked "default-deny + allow role=client: other -> server" || true

    kubectl_ delete namespace "$SW_K8S_SELFTEST_NS" --wait=true --timeout=60s >/dev/null ||
        say "the namespace $SW_K8S_SELFTEST_NS was not removed within 60s"
    say "selftest took $((SECONDS - started))s"
    echo "k8s-selftest: $SW_K8S_PASSED passed, $SW_K8S_FAILED failed"
    [ "$SW_K8S_FAILED" = 0 ]
}
