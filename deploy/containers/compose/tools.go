//go:build tools

// Package tools pins the compose command this module builds.
package tools

import _ "github.com/docker/compose/v5/cmd"
