// Command etcd is etcd's own main package (go.etcd.io/etcd/v3's main.go) in a module of its
// own: that module replaces its sibling modules with relative paths, so it is not buildable
// from the module proxy, while go.etcd.io/etcd/server/v3, which holds etcdmain, is.
package main

import (
	"os"

	"go.etcd.io/etcd/server/v3/etcdmain"
)

func main() {
	etcdmain.Main(os.Args)
}
