// Command probe is the one program of the image scripts/k8s selftest runs in its pods:
//
//	probe serve <port>           answers every HTTP GET with "hello from <hostname>"
//	probe get <url> <timeout>    one GET; prints the body and exits 0 on 200, else says why
//	                             on stderr and exits 1
//
// Static (CGO_ENABLED=0), so the image is this file alone; Go's own resolver reads the
// /etc/resolv.conf the kubelet writes into the pod.
package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/signal"
	"syscall"
	"time"
)

func main() {
	if err := run(os.Args[1:]); err != nil {
		fmt.Fprintln(os.Stderr, "probe:", err)
		os.Exit(1)
	}
}

func run(args []string) error {
	switch {
	case len(args) == 2 && args[0] == "serve":
		return serve(args[1])
	case len(args) == 3 && args[0] == "get":
		timeout, err := time.ParseDuration(args[2])
		if err != nil {
			return fmt.Errorf("timeout %q: %w", args[2], err)
		}
		return get(args[1], timeout)
	default:
		return errors.New("usage: probe serve <port> | probe get <url> <timeout>")
	}
}

func serve(port string) error {
	host, err := os.Hostname()
	if err != nil {
		return fmt.Errorf("hostname: %w", err)
	}
	srv := &http.Server{
		Addr:              ":" + port,
		ReadHeaderTimeout: 5 * time.Second,
		Handler: http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
			fmt.Fprintf(w, "hello from %s\n", host)
		}),
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, os.Interrupt)
	defer stop()
	go func() {
		<-ctx.Done()
		shutdown, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = srv.Shutdown(shutdown)
	}()
	if err := srv.ListenAndServe(); !errors.Is(err, http.ErrServerClosed) {
		return err
	}
	return nil
}

func get(url string, timeout time.Duration) error {
	client := &http.Client{Timeout: timeout}
	resp, err := client.Get(url)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(io.LimitReader(resp.Body, 1<<16))
	if err != nil {
		return fmt.Errorf("reading the body: %w", err)
	}
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("%s: status %d", url, resp.StatusCode)
	}
	_, err = os.Stdout.Write(body)
	return err
}
