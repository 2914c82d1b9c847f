//go:build tools

// Package tools pins the command this module builds (see scripts/lib/k8s-build.sh).
package tools

import _ "sigs.k8s.io/kube-network-policies/cmd"
