# shellcheck shell=bash
# `scripts/k8s deploy [OVERLAY]`: sagaworks on the cluster of scripts/k8s, the way a user
# applies it, from images built on this machine. Sourced by scripts/k8s (its STATE, PKI,
# kubectl_, spawn, issue, kubeconfig, ctr_ and die/say are in scope). Steps:
#
#   1. render the overlay (default k8s/overlays/local) with the cluster's kubectl;
#   2. copy every image it names from Docker into the cluster's containerd, unless the same
#      image (by Docker's image ID) is there already; a missing Docker image stops here
#      (scripts/images builds them);
#   3. cert-manager: its CRDs (from its module, deploy/crds/), deploy/k8s-cluster/
#      cert-manager-rbac.yaml and its controller as a process (component cert-manager,
#      client certificate for the user sagaworks:cert-manager);
#   4. a PersistentVolume per claim of each StatefulSet's volumeClaimTemplates (the cluster
#      has no StorageClass): a hostPath directory under <state>/volumes/, owned by the pod's
#      runAsUser and fsGroup, bound to its claim by claimRef (reclaim policy Retain, so the
#      data outlives a deleted claim; `scripts/k8s down --purge` removes it);
#   5. `kubectl apply -k OVERLAY`, then waits (each bounded by SW_K8S_DEPLOY_SECS, default
#      600) for every Certificate Ready, every Job Complete, every Deployment and
#      StatefulSet rolled out, and every Pod Ready or Succeeded; prints the time from apply
#      until then and each init container's exit.

SW_K8S_DEPLOY_SECS="${SW_K8S_DEPLOY_SECS:-600}"

# The images of every container and init container of the rendered overlay, one a line.
sw_k8s_rendered_images() { # rendered.yaml
    python3 - "$1" <<'PY'
import sys, yaml
images = set()
for doc in yaml.safe_load_all(open(sys.argv[1])):
    if not doc or doc.get("kind") not in ("Deployment", "StatefulSet", "Job", "DaemonSet"):
        continue
    spec = doc["spec"]["template"]["spec"]
    for c in spec.get("initContainers", []) + spec.get("containers", []):
        images.add(c["image"])
print("\n".join(sorted(images)))
PY
}

# Copies <image> from Docker into the cluster's containerd unless the one there has the same
# Docker image ID (recorded in <state>/images/ when it was loaded).
sw_k8s_load_if_changed() { # image
    local image="$1" id mark ref
    id="$(docker image inspect --format '{{.Id}}' "$image" 2>/dev/null)" ||
        die "no Docker image $image (scripts/images builds the images the overlay names)"
    mark="$STATE/images/$(printf '%s' "$image" | tr '/:' '__').id"
    ref="docker.io/$image"
    case "${image%%/*}" in *.*) ref="$image" ;; esac
    if [ "$(cat "$mark" 2>/dev/null)" = "$id" ] && ctr_ images ls -q | grep -qxF "$ref"; then
        say "image $image is loaded already"
        return 0
    fi
    mkdir -p "$STATE/images"
    docker save "$image" | ctr_ images import - >/dev/null
    echo "$id" >"$mark"
    say "loaded $image into the cluster's containerd"
}

# PersistentVolumes for the StatefulSets' claims of <rendered.yaml>, on stdout; creates
# each hostPath directory, owned by the pod's runAsUser:fsGroup, mode 0700.
sw_k8s_volumes() { # rendered.yaml, volumes dir
    python3 - "$1" "$2" <<'PY'
import os, sys, yaml
rendered, root = sys.argv[1], sys.argv[2]
out = []
for doc in yaml.safe_load_all(open(rendered)):
    if not doc or doc.get("kind") != "StatefulSet":
        continue
    meta, spec = doc["metadata"], doc["spec"]
    ns, name = meta["namespace"], meta["name"]
    pod_sc = spec["template"]["spec"].get("securityContext", {})
    uid = pod_sc.get("runAsUser", 0)
    gid = pod_sc.get("fsGroup", pod_sc.get("runAsGroup", 0))
    for tmpl in spec.get("volumeClaimTemplates", []):
        for ordinal in range(spec.get("replicas", 1)):
            claim = f"{tmpl['metadata']['name']}-{name}-{ordinal}"
            path = os.path.join(root, ns, claim)
            os.makedirs(path, exist_ok=True)
            os.chown(path, uid, gid)
            os.chmod(path, 0o700)
            out.append({
                "apiVersion": "v1",
                "kind": "PersistentVolume",
                "metadata": {"name": f"{ns}-{claim}", "labels": {"app.kubernetes.io/managed-by": "sagaworks-k8s"}},
                "spec": {
                    "capacity": {"storage": tmpl["spec"]["resources"]["requests"]["storage"]},
                    "accessModes": tmpl["spec"]["accessModes"],
                    "persistentVolumeReclaimPolicy": "Retain",
                    "storageClassName": tmpl["spec"].get("storageClassName", ""),
                    "claimRef": {"namespace": ns, "name": claim},
                    "hostPath": {"path": path, "type": "Directory"},
                },
            })
yaml.safe_dump_all(out, sys.stdout, sort_keys=False)
PY
}

# A volume whose claim was deleted (namespace deleted, say) is Released and binds to nothing;
# without the old claim's uid it binds to the claim of the same name again, data and all.
sw_k8s_rebind_volumes() {
    local pv
    for pv in $(kubectl_ get pv -l app.kubernetes.io/managed-by=sagaworks-k8s \
        -o jsonpath='{range .items[?(@.status.phase=="Released")]}{.metadata.name}{"\n"}{end}'); do
        kubectl_ patch pv "$pv" --type json -p '[{"op": "remove", "path": "/spec/claimRef/uid"}, {"op": "remove", "path": "/spec/claimRef/resourceVersion"}]' >/dev/null
        say "volume $pv released by a deleted claim: bound to its claim again"
    done
}

sw_k8s_cert_manager_up() {
    local dir
    dir="$(sw_k8s_cert_manager_dir)" || die "building cert-manager failed (see above)"
    kubectl_ --request-timeout=60s apply --server-side --force-conflicts -f "$dir/crds" >/dev/null
    kubectl_ wait --for=condition=Established --timeout=60s -f "$dir/crds" >/dev/null
    kubectl_ --request-timeout=60s apply -f "$ROOT/deploy/k8s-cluster/cert-manager-rbac.yaml" >/dev/null
    issue cert-manager "/CN=sagaworks:cert-manager" clientAuth ""
    kubeconfig cert-manager "https://$NODE_IP:6443"
    spawn cert-manager "$dir/cert-manager-controller" --kubeconfig "$STATE/cert-manager.kubeconfig"
    sleep 1
    pid_of cert-manager >/dev/null || { tail -n 20 "$STATE/logs/cert-manager.log" >&2; die "cert-manager exited"; }
}

# Runs `kubectl wait ...` with what is left of the deploy's time, stopping the deploy when
# it runs out.
sw_k8s_deploy_wait() { # what, kubectl wait command...
    local what="$1" left=$((SW_K8S_DEPLOY_DEADLINE - SECONDS))
    shift
    [ $left -gt 0 ] || left=1
    "$@" --timeout="${left}s" >/dev/null || {
        kubectl_ -n "$SW_K8S_NS" get pods -o wide >&2 || true
        die "no $what within ${SW_K8S_DEPLOY_SECS}s of the apply"
    }
    say "$what after $((SECONDS - SW_K8S_APPLIED))s"
}

# Every pod of the namespace with its state and its init containers' exits, on stderr;
# fails when one is neither Ready nor Succeeded.
sw_k8s_pods_report() {
    local report
    report="$(cat <<'PY'
import json, sys
bad = 0
for pod in json.load(sys.stdin)["items"]:
    name, status = pod["metadata"]["name"], pod["status"]
    ready = any(c["type"] == "Ready" and c["status"] == "True" for c in status.get("conditions", []))
    phase = status.get("phase")
    inits = []
    for c in status.get("initContainerStatuses", []):
        done = c["state"].get("terminated")
        inits.append(f"{c['name']} exit {done['exitCode']}" if done else f"{c['name']} not finished")
    bad += not (ready or phase == "Succeeded")
    state = "Ready" if ready else phase
    print(f"  {name:36} {state:10} {'init: ' + ', '.join(inits) if inits else ''}", file=sys.stderr)
sys.exit(1 if bad else 0)
PY
)"
    kubectl_ -n "$SW_K8S_NS" get pods -o json | python3 -c "$report"
}

sw_k8s_deploy() { # overlay dir (default k8s/overlays/local)
    local overlay="${1:-$ROOT/k8s/overlays/local}" rendered image started
    [ -f "$overlay/kustomization.yaml" ] || die "no kustomization.yaml in $overlay"
    { pid_of kube-apiserver && pid_of containerd; } >/dev/null || die "the cluster does not run (scripts/k8s up)"
    command -v docker >/dev/null || die "docker is missing"
    python3 -c 'import yaml' 2>/dev/null || die "python3 has no yaml module (apt-get install python3-yaml)"
    rendered="$(mktemp)"
    # shellcheck disable=SC2064 # the path, now
    trap "rm -f '$rendered'" RETURN
    kubectl_ kustomize "$overlay" >"$rendered"
    SW_K8S_NS="$(python3 -c 'import sys, yaml; print(next(d["metadata"]["name"] for d in yaml.safe_load_all(open(sys.argv[1])) if d and d["kind"] == "Namespace"))' "$rendered")"

    started=$SECONDS
    for image in $(sw_k8s_rendered_images "$rendered"); do sw_k8s_load_if_changed "$image"; done
    say "images loaded in $((SECONDS - started))s"

    sw_k8s_cert_manager_up
    sw_k8s_volumes "$rendered" "$STATE/volumes" | kubectl_ apply -f - >/dev/null
    sw_k8s_rebind_volumes
    say "cert-manager runs; PersistentVolumes under $STATE/volumes"

    SW_K8S_APPLIED=$SECONDS
    SW_K8S_DEPLOY_DEADLINE=$((SECONDS + SW_K8S_DEPLOY_SECS))
    kubectl_ apply -f "$rendered" >/dev/null
    say "applied $overlay (namespace $SW_K8S_NS)"
    sw_k8s_deploy_wait "every Certificate Ready" kubectl_ -n "$SW_K8S_NS" wait --for=condition=Ready certificate --all
    sw_k8s_deploy_wait "every StatefulSet ready" kubectl_ -n "$SW_K8S_NS" wait --for=jsonpath='{.status.readyReplicas}'=1 statefulset --all
    sw_k8s_deploy_wait "every Job Complete" kubectl_ -n "$SW_K8S_NS" wait --for=condition=Complete job --all
    sw_k8s_deploy_wait "every Deployment Available" kubectl_ -n "$SW_K8S_NS" wait --for=condition=Available deployment --all
    sw_k8s_deploy_wait "every Pod Ready or Succeeded" kubectl_ -n "$SW_K8S_NS" wait --for=condition=Ready pod --field-selector=status.phase!=Succeeded --all
    sw_k8s_pods_report || die "a pod is neither Ready nor Succeeded"
    say "deployed in $((SECONDS - SW_K8S_APPLIED))s from the apply until every Pod was Ready"
}

# Deletes the namespace of <overlay> (default k8s/overlays/local) and waits until it is gone,
# then its PersistentVolumes and their directories: the next deploy starts from empty
# databases and an empty broker.
sw_k8s_undeploy() { # overlay dir
    local overlay="${1:-$ROOT/k8s/overlays/local}" ns pv
    [ -f "$overlay/kustomization.yaml" ] || die "no kustomization.yaml in $overlay"
    pid_of kube-apiserver >/dev/null || die "the cluster does not run (scripts/k8s up)"
    ns="$(kubectl_ kustomize "$overlay" | python3 -c 'import sys, yaml; print(next(d["metadata"]["name"] for d in list(yaml.safe_load_all(sys.stdin)) if d and d["kind"] == "Namespace"))')" ||
        die "no Namespace in $overlay"
    # The data goes with the namespace, so its Pods need no graceful stop: the namespace
    # first (no controller creates a Pod in it from then on), then its Pods with a grace
    # period of one second instead of their preStop and drain (the databases' and the
    # broker's grace periods are a minute).
    kubectl_ delete namespace "$ns" --ignore-not-found --wait=false >/dev/null
    kubectl_ -n "$ns" delete pods --all --grace-period=1 --wait=false >/dev/null 2>&1 || true
    kubectl_ wait --for=delete "namespace/$ns" --timeout=300s >/dev/null 2>&1 ||
        die "namespace $ns is not gone after 300s"
    for pv in $(kubectl_ get pv -l app.kubernetes.io/managed-by=sagaworks-k8s \
        -o jsonpath="{range .items[?(@.spec.claimRef.namespace==\"$ns\")]}{.metadata.name}{\"\\n\"}{end}"); do
        kubectl_ delete pv "$pv" --wait=true >/dev/null
    done
    rm -rf "${STATE:?}/volumes/$ns"
    say "namespace $ns, its volumes and their data removed"
}
