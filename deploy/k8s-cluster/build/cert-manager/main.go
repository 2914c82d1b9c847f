// Command cert-manager-controller runs cert-manager's controllers for the issuers the dev
// overlay uses (SelfSigned and CA Issuers, Certificates, CertificateRequests and their
// approval) as a process with a kubeconfig. cert-manager's own command lives in a module
// the Go module proxy does not serve (github.com/cert-manager/cert-manager/cmd/controller),
// so this main builds the same controllers from the library packages of
// github.com/cert-manager/cert-manager through their registry (pkg/controller.Register).
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"sync"
	"syscall"
	"time"

	controllerpkg "github.com/cert-manager/cert-manager/pkg/controller"
	logf "github.com/cert-manager/cert-manager/pkg/logs"

	_ "github.com/cert-manager/cert-manager/pkg/controller/certificaterequests/approver"
	_ "github.com/cert-manager/cert-manager/pkg/controller/certificaterequests/ca"
	_ "github.com/cert-manager/cert-manager/pkg/controller/certificaterequests/selfsigned"
	_ "github.com/cert-manager/cert-manager/pkg/controller/certificates/issuing"
	_ "github.com/cert-manager/cert-manager/pkg/controller/certificates/keymanager"
	_ "github.com/cert-manager/cert-manager/pkg/controller/certificates/readiness"
	_ "github.com/cert-manager/cert-manager/pkg/controller/certificates/requestmanager"
	_ "github.com/cert-manager/cert-manager/pkg/controller/certificates/revisionmanager"
	_ "github.com/cert-manager/cert-manager/pkg/controller/certificates/trigger"
	_ "github.com/cert-manager/cert-manager/pkg/controller/clusterissuers"
	_ "github.com/cert-manager/cert-manager/pkg/controller/issuers"
	_ "github.com/cert-manager/cert-manager/pkg/issuer/ca"
	_ "github.com/cert-manager/cert-manager/pkg/issuer/selfsigned"
)

// The controllers this command runs, by their registered names.
var controllers = []string{
	"issuers",
	"clusterissuers",
	"certificates-trigger",
	"certificates-issuing",
	"certificates-key-manager",
	"certificates-request-manager",
	"certificates-readiness",
	"certificates-revision-manager",
	"certificaterequests-approver",
	"certificaterequests-issuer-ca",
	"certificaterequests-issuer-selfsigned",
}

func main() {
	kubeconfig := flag.String("kubeconfig", "", "the kubeconfig to reach the API server with")
	clusterNS := flag.String("cluster-resource-namespace", "cert-manager", "where ClusterIssuers keep their Secrets")
	workers := flag.Int("workers", 2, "workers per controller")
	flag.Parse()
	if err := run(*kubeconfig, *clusterNS, *workers); err != nil {
		fmt.Fprintln(os.Stderr, "cert-manager-controller:", err)
		os.Exit(1)
	}
}

func run(kubeconfig, clusterNS string, workers int) error {
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	ctx = logf.NewContext(ctx, logf.Log, "cert-manager-controller")

	opts := controllerpkg.ContextOptions{Kubeconfig: kubeconfig, KubernetesAPIQPS: 20, KubernetesAPIBurst: 50}
	opts.ClusterResourceNamespace = clusterNS
	opts.CertificateRequestMinimumBackoffDuration = time.Second
	opts.CertificateRequestMaximumBackoffDuration = 32 * time.Second
	factory, err := controllerpkg.NewContextFactory(ctx, opts)
	if err != nil {
		return fmt.Errorf("building the controller context: %w", err)
	}
	known := controllerpkg.Known()
	var running []controllerpkg.Interface
	for _, name := range controllers {
		construct, ok := known[name]
		if !ok {
			return fmt.Errorf("no controller named %q is registered", name)
		}
		c, err := construct(factory)
		if err != nil {
			return fmt.Errorf("constructing controller %q: %w", name, err)
		}
		running = append(running, c)
	}
	shared, err := factory.Build()
	if err != nil {
		return fmt.Errorf("building the shared context: %w", err)
	}
	shared.KubeSharedInformerFactory.Start(ctx.Done())
	shared.SharedInformerFactory.Start(ctx.Done())

	var wg sync.WaitGroup
	errs := make(chan error, len(running))
	for i, c := range running {
		wg.Add(1)
		go func(name string, c controllerpkg.Interface) {
			defer wg.Done()
			if err := c.Run(workers, ctx); err != nil {
				errs <- fmt.Errorf("controller %q: %w", name, err)
				stop()
			}
		}(controllers[i], c)
	}
	fmt.Fprintf(os.Stderr, "cert-manager-controller: running %d controllers\n", len(running))
	wg.Wait()
	close(errs)
	return <-errs
}
