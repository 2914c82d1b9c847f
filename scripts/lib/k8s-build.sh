# shellcheck shell=bash
# The binaries of the single-node Kubernetes cluster of scripts/k8s, built from the Go
# module proxy once per machine: source this, then
#
#   sw_k8s_kubernetes_dir   directory holding kube-apiserver, kube-controller-manager,
#                           kube-scheduler, kubelet, kube-proxy and kubectl
#   sw_k8s_etcd_bin         etcd
#   sw_k8s_coredns_bin      CoreDNS
#   sw_k8s_knp_bin          kube-network-policies (the NetworkPolicy enforcer)
#   sw_k8s_pause_image      directory holding image.tar: the pod sandbox's image, pause.c
#                           built with gcc -static as its one file
#   sw_k8s_coredns_image    directory holding image.tar: CoreDNS's image, the binary alone
#   sw_k8s_probe_image      directory holding image.tar: the selftest's image (build/probe)
#   sw_k8s_cert_manager_dir directory holding cert-manager-controller and crds/ (the CRDs of
#                           cert-manager's module, deploy/crds/*.yaml)
#
# The images are OCI archives of one layer for `ctr -n k8s.io images import`, written by
# sw_k8s_oci_image: no registry answers here, registry.k8s.io/pause included.
#
# Each prints its path on stdout (progress on stderr) and builds what is missing first.
# What is built, each from a wrapper module under deploy/k8s-cluster/build/ whose go.mod and
# go.sum pin every dependency:
#   * kubernetes/: k8s.io/kubernetes (SW_K8S_VERSION) with each k8s.io/* staging module
#     replaced by its published v0.x (gen-go-mod.sh writes that go.mod); the six commands in
#     one `go build`, their version stamped as upstream's release does (nodes, kubectl and
#     the version-skew checks read it).
#   * etcd/: go.etcd.io/etcd/server/v3's etcdmain behind a main package of three lines (the
#     module with etcd's own main, go.etcd.io/etcd/v3, replaces its siblings with paths).
#   * coredns/: github.com/coredns/coredns with its default plugins.
#   * kube-network-policies/: sigs.k8s.io/kube-network-policies's standalone command.
#   * cert-manager/: github.com/cert-manager/cert-manager's controllers for SelfSigned and CA
#     issuers behind a main of its own (cert-manager's command is a module of its own that
#     the module proxy does not serve; main.go says which controllers it runs).
# All with the machine's Go (GOTOOLCHAIN=local), CGO_ENABLED=0, -trimpath, -buildvcs=false,
# kept in ${XDG_CACHE_HOME:-$HOME/.cache}/sagaworks/bin/ named by version and the hash of
# the wrapper module's files: scripts/lib/tracing.sh's sw_tracing_build_once builds into a
# temporary name under a lock and renames the result, so an interrupted or concurrent build
# leaves nothing half-built.

SW_K8S_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
# shellcheck source=scripts/lib/tracing.sh
. "$SW_K8S_ROOT/scripts/lib/tracing.sh"
SW_K8S_BUILD="$SW_K8S_ROOT/deploy/k8s-cluster/build"

SW_K8S_VERSION=v1.34.4
SW_K8S_COMMANDS="kube-apiserver kube-controller-manager kube-scheduler kubelet kube-proxy kubectl"

sw_k8s_err() { printf 'k8s: %s\n' "$*" >&2; }

# The version a wrapper module's go.mod requires of a module.
sw_k8s_required() { # wrapper dir, module
    awk -v m="$2" '$1 == m && $2 ~ /^v/ { print $2; exit } $1 == "require" && $2 == m { print $3; exit }' \
        "$SW_K8S_BUILD/$1/go.mod"
}

# The commit of a module version, as the module proxy records it (empty when it does not).
sw_k8s_commit() { # wrapper dir, module@version
    (cd "$SW_K8S_BUILD/$1" && GOTOOLCHAIN=local go mod download -json "$2") |
        sed -n 's/^[[:space:]]*"Hash": "\([0-9a-f]*\)".*/\1/p'
}

sw_k8s_go_build() { # wrapper dir, ldflags, output, packages...
    local dir="$1" ldflags="$2" out="$3"
    shift 3
    (cd "$SW_K8S_BUILD/$dir" && GOTOOLCHAIN=local CGO_ENABLED=0 \
        GOFLAGS="${GOFLAGS:+$GOFLAGS }-buildvcs=false" \
        go build -mod=readonly -trimpath -ldflags "-s -w $ldflags" -o "$out" "$@") >&2
}

# Called by sw_tracing_build_once under its lock: the six commands into the directory $2.
sw_tracing_build_kubernetes() { # scratch dir, output directory
    local v="$SW_K8S_VERSION" minor commit pkg flags="" cmd pkgs=()
    minor="${v#v1.}"
    minor="${minor%%.*}"
    commit="$(sw_k8s_commit kubernetes "k8s.io/kubernetes@$v")"
    for pkg in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
        flags+=" -X $pkg.gitVersion=$v -X $pkg.gitMajor=1 -X $pkg.gitMinor=$minor"
        flags+=" -X $pkg.gitTreeState=clean -X $pkg.buildDate=1970-01-01T00:00:00Z"
        [ -z "$commit" ] || flags+=" -X $pkg.gitCommit=$commit"
    done
    for cmd in $SW_K8S_COMMANDS; do pkgs+=("k8s.io/kubernetes/cmd/$cmd"); done
    mkdir -p "$2"
    sw_k8s_go_build kubernetes "$flags" "$2/" "${pkgs[@]}" || return 1
    for cmd in $SW_K8S_COMMANDS; do
        [ -x "$2/$cmd" ] || { sw_k8s_err "the build left no $cmd"; return 1; }
    done
    "$2/kubectl" version --client 2>/dev/null | grep -q "Client Version: $v\$" ||
        { sw_k8s_err "kubectl does not say it is $v"; return 1; }
}

# Where the Kubernetes commands are, built or not.
sw_k8s_kubernetes_path() {
    local dir="$SW_K8S_BUILD/kubernetes"
    printf '%s\n' "$(sw_tracing_bin_dir)/kubernetes-$SW_K8S_VERSION-$(sw_tracing_hash "$dir/go.mod" "$dir/go.sum" "$dir/tools.go")"
}

sw_k8s_kubernetes_dir() {
    local dir="$SW_K8S_BUILD/kubernetes" out
    grep -q "^require k8s.io/kubernetes $SW_K8S_VERSION\$" "$dir/go.mod" ||
        { sw_k8s_err "$dir/go.mod does not require k8s.io/kubernetes $SW_K8S_VERSION: run $dir/gen-go-mod.sh $SW_K8S_VERSION"; return 1; }
    out="$(sw_k8s_kubernetes_path)"
    if [ ! -x "$out/kubectl" ]; then
        sw_tracing_need_go || return 1
        sw_tracing_build_once "$out" kubernetes "Kubernetes $SW_K8S_VERSION ($SW_K8S_COMMANDS)" || return 1
    fi
    printf '%s\n' "$out"
}

sw_tracing_build_etcd() { # scratch dir, output binary
    sw_k8s_go_build etcd "" "$2" . || return 1
    "$2" --version | grep -q "^etcd Version: ${SW_K8S_ETCD_VERSION#v}\$" ||
        { sw_k8s_err "etcd does not say it is $SW_K8S_ETCD_VERSION"; return 1; }
}

sw_tracing_build_coredns() { # scratch dir, output binary
    local commit
    commit="$(sw_k8s_commit coredns "github.com/coredns/coredns@$SW_K8S_COREDNS_VERSION")"
    sw_k8s_go_build coredns "-X github.com/coredns/coredns/coremain.GitCommit=${commit:0:12}" "$2" . || return 1
    "$2" -plugins | grep -qx kubernetes || { sw_k8s_err "CoreDNS has no kubernetes plugin"; return 1; }
    "$2" -version | grep -qx "CoreDNS-${SW_K8S_COREDNS_VERSION#v}" ||
        { sw_k8s_err "CoreDNS does not say it is $SW_K8S_COREDNS_VERSION"; return 1; }
}

# kube-network-policies with kube-network-policies.patch: its packets go to user space
# through the xtables NFQUEUE target (this machine's kernel has no nftables queue
# expression, CONFIG_NFT_QUEUE), and it takes --kubeconfig to run as a process outside
# the cluster. The module's source, as the module proxy serves it (checked against the
# checksum database), is copied into the scratch dir beside a copy of the wrapper module
# whose go.mod replaces it with that copy.
sw_tracing_build_knp() { # scratch dir, output binary
    local src
    src="$(cd "$1" && GOTOOLCHAIN=local go mod download -json \
        "sigs.k8s.io/kube-network-policies@$SW_K8S_KNP_VERSION" | sed -n 's/^[[:space:]]*"Dir": "\(.*\)",$/\1/p')"
    [ -d "$src" ] || { sw_k8s_err "go mod download gave no directory for kube-network-policies"; return 1; }
    cp "$SW_K8S_BUILD/kube-network-policies/"{go.mod,go.sum,tools.go} "$1/" &&
        cp -r "$src" "$1/src" && chmod -R u+w "$1/src" &&
        patch -s -d "$1/src" -p1 <"$SW_K8S_BUILD/kube-network-policies/kube-network-policies.patch" || return 1
    (cd "$1" && GOTOOLCHAIN=local CGO_ENABLED=0 GOFLAGS="${GOFLAGS:+$GOFLAGS }-buildvcs=false" \
        go build -mod=readonly -trimpath -ldflags "-s -w" -o "$2" sigs.k8s.io/kube-network-policies/cmd) >&2
}

# An OCI image archive of one layer, the files of <rootfs>, for `ctr images import`; the
# annotation io.containerd.image.name names it in containerd.
sw_k8s_oci_image() { # rootfs dir, image name, entrypoint (JSON array), output tar
    local root="$1" name="$2" entry="$3" out="$4" oci layer config manifest
    oci="$(mktemp -d "$out.XXXXXX")" || return 1
    mkdir -p "$oci/blobs/sha256"
    tar -C "$root" --sort=name --mtime=@0 --owner=0 --group=0 --numeric-owner -cf "$oci/layer.tar" . || return 1
    layer="$(sha256sum "$oci/layer.tar" | cut -d' ' -f1)"
    mv "$oci/layer.tar" "$oci/blobs/sha256/$layer"
    printf '{"architecture":"amd64","os":"linux","config":{"Entrypoint":%s},"rootfs":{"type":"layers","diff_ids":["sha256:%s"]}}' \
        "$entry" "$layer" >"$oci/config.json"
    config="$(sha256sum "$oci/config.json" | cut -d' ' -f1)"
    printf '{"schemaVersion":2,"mediaType":"application/vnd.oci.image.manifest.v1+json","config":{"mediaType":"application/vnd.oci.image.config.v1+json","digest":"sha256:%s","size":%s},"layers":[{"mediaType":"application/vnd.oci.image.layer.v1.tar","digest":"sha256:%s","size":%s}]}' \
        "$config" "$(stat -c %s "$oci/config.json")" "$layer" "$(stat -c %s "$oci/blobs/sha256/$layer")" >"$oci/manifest.json"
    manifest="$(sha256sum "$oci/manifest.json" | cut -d' ' -f1)"
    printf '{"schemaVersion":2,"manifests":[{"mediaType":"application/vnd.oci.image.manifest.v1+json","digest":"sha256:%s","size":%s,"annotations":{"io.containerd.image.name":"%s","org.opencontainers.image.ref.name":"%s"}}]}' \
        "$manifest" "$(stat -c %s "$oci/manifest.json")" "$name" "${name##*:}" >"$oci/index.json"
    mv "$oci/config.json" "$oci/blobs/sha256/$config"
    mv "$oci/manifest.json" "$oci/blobs/sha256/$manifest"
    printf '{"imageLayoutVersion":"1.0.0"}' >"$oci/oci-layout"
    tar -C "$oci" --sort=name --mtime=@0 --owner=0 --group=0 --numeric-owner -cf "$out" oci-layout index.json blobs &&
        rm -rf "$oci"
}

# The pod sandbox image: pause.c, static, as /pause.
sw_tracing_build_pause() { # scratch dir, output directory
    command -v gcc >/dev/null || { sw_k8s_err "gcc is missing (apt-get install gcc libc6-dev)"; return 1; }
    mkdir -p "$1/root" "$2"
    gcc -static -Os -Wall -Wextra -Werror -o "$1/root/pause" "$SW_K8S_BUILD/pause/pause.c" >&2 || return 1
    sw_k8s_oci_image "$1/root" "$SW_K8S_PAUSE_IMAGE" '["/pause"]' "$2/image.tar"
}

# The selftest's image: build/probe, static, as /probe.
sw_tracing_build_probe() { # scratch dir, output directory
    mkdir -p "$1/root" "$2"
    sw_k8s_go_build probe "" "$1/root/probe" . || return 1
    sw_k8s_oci_image "$1/root" "$SW_K8S_PROBE_IMAGE" '["/probe"]' "$2/image.tar"
}

SW_K8S_ETCD_VERSION=v3.6.17
SW_K8S_COREDNS_VERSION=v1.14.7
SW_K8S_KNP_VERSION=v0.8.0
SW_K8S_PAUSE_IMAGE=sagaworks.local/pause:3.10
SW_K8S_PROBE_IMAGE=sagaworks.local/k8s-probe:2

# Builds <what> into <name>-<version>-<hash of the files given> unless it is there.
sw_k8s_built() { # what, name, version, label, files...
    local what="$1" name="$2" version="$3" label="$4" out
    shift 4
    out="$(sw_tracing_bin_dir)/$name-$version-$(sw_tracing_hash "$@")"
    if [ ! -x "$out" ]; then
        sw_tracing_need_go || return 1
        sw_tracing_build_once "$out" "$what" "$label" || return 1
    fi
    printf '%s\n' "$out"
}

sw_k8s_etcd_bin() {
    local d="$SW_K8S_BUILD/etcd"
    grep -q "go.etcd.io/etcd/server/v3 $SW_K8S_ETCD_VERSION\$" "$d/go.mod" ||
        { sw_k8s_err "$d/go.mod does not require etcd $SW_K8S_ETCD_VERSION"; return 1; }
    sw_k8s_built etcd etcd "$SW_K8S_ETCD_VERSION" "etcd $SW_K8S_ETCD_VERSION" "$d/go.mod" "$d/go.sum" "$d/main.go"
}

sw_k8s_coredns_bin() {
    local d="$SW_K8S_BUILD/coredns"
    grep -q "github.com/coredns/coredns $SW_K8S_COREDNS_VERSION\$" "$d/go.mod" ||
        { sw_k8s_err "$d/go.mod does not require CoreDNS $SW_K8S_COREDNS_VERSION"; return 1; }
    sw_k8s_built coredns coredns "$SW_K8S_COREDNS_VERSION" "CoreDNS $SW_K8S_COREDNS_VERSION" "$d/go.mod" "$d/go.sum" "$d/main.go"
}

sw_k8s_knp_bin() {
    local d="$SW_K8S_BUILD/kube-network-policies"
    grep -q "sigs.k8s.io/kube-network-policies $SW_K8S_KNP_VERSION\$" "$d/go.mod" ||
        { sw_k8s_err "$d/go.mod does not require kube-network-policies $SW_K8S_KNP_VERSION"; return 1; }
    sw_k8s_built knp kube-network-policies "$SW_K8S_KNP_VERSION" "kube-network-policies $SW_K8S_KNP_VERSION (patched)" \
        "$d/go.mod" "$d/go.sum" "$d/tools.go" "$d/kube-network-policies.patch"
}

# Directories holding image.tar.
sw_k8s_pause_image() {
    sw_k8s_built pause pause-image "${SW_K8S_PAUSE_IMAGE##*:}" "the pause image $SW_K8S_PAUSE_IMAGE" \
        "$SW_K8S_BUILD/pause/pause.c"
}

sw_k8s_probe_image() {
    local d="$SW_K8S_BUILD/probe"
    sw_k8s_built probe probe-image "${SW_K8S_PROBE_IMAGE##*:}" "the selftest image $SW_K8S_PROBE_IMAGE" \
        "$d/go.mod" "$d/main.go"
}

SW_K8S_COREDNS_IMAGE="sagaworks.local/coredns:$SW_K8S_COREDNS_VERSION"

# CoreDNS's image: the binary of sw_k8s_coredns_bin as /coredns (SW_K8S_FROM names it).
sw_tracing_build_coredns_image() { # scratch dir, output directory
    mkdir -p "$1/root" "$2"
    cp "$SW_K8S_FROM" "$1/root/coredns" || return 1
    sw_k8s_oci_image "$1/root" "$SW_K8S_COREDNS_IMAGE" '["/coredns"]' "$2/image.tar"
}

sw_k8s_coredns_image() {
    local bin
    bin="$(sw_k8s_coredns_bin)" || return 1
    SW_K8S_FROM="$bin" sw_k8s_built coredns_image coredns-image "$SW_K8S_COREDNS_VERSION" \
        "the CoreDNS image $SW_K8S_COREDNS_IMAGE" "$bin"
}

SW_K8S_CERT_MANAGER_VERSION=v1.21.2

# cert-manager's controller and the CRDs its module carries (deploy/crds/), in one directory.
sw_tracing_build_cert_manager() { # scratch dir, output directory
    local src
    src="$(cd "$SW_K8S_BUILD/cert-manager" && GOTOOLCHAIN=local go mod download -json \
        "github.com/cert-manager/cert-manager@$SW_K8S_CERT_MANAGER_VERSION" | sed -n 's/^[[:space:]]*"Dir": "\(.*\)",$/\1/p')"
    [ -d "$src/deploy/crds" ] || { sw_k8s_err "cert-manager's module has no deploy/crds"; return 1; }
    mkdir -p "$2/crds"
    cp "$src"/deploy/crds/*cert-manager.io_*.yaml "$2/crds/" || return 1
    sw_k8s_go_build cert-manager "" "$2/cert-manager-controller" .
}

sw_k8s_cert_manager_dir() {
    local d="$SW_K8S_BUILD/cert-manager"
    grep -q "github.com/cert-manager/cert-manager $SW_K8S_CERT_MANAGER_VERSION\$" "$d/go.mod" ||
        { sw_k8s_err "$d/go.mod does not require cert-manager $SW_K8S_CERT_MANAGER_VERSION"; return 1; }
    sw_k8s_built cert_manager cert-manager "$SW_K8S_CERT_MANAGER_VERSION" "cert-manager $SW_K8S_CERT_MANAGER_VERSION (controller)" \
        "$d/go.mod" "$d/go.sum" "$d/main.go"
}
