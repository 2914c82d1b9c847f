// Command probe is the one program of the image that scripts/k8s selftest and the
// Kubernetes smoke test (scripts/test-k8s) run in their pods:
//
//	probe serve <port>           answers every HTTP GET with "hello from <hostname>"
//	probe get <url> <timeout>    one GET; prints the body and exits 0 on 200, else says why
//	                             on stderr and exits 1
//	probe tcp <host:port> <timeout>
//	                             one TCP connection; exits 0 when it is established, else
//	                             says why on stderr and exits 1
//	probe grpc <https URL> <dir> <timeout>
//	                             one unary gRPC call with an empty request message over
//	                             mutual TLS: <dir> holds tls.crt, tls.key and ca.crt (a
//	                             kubernetes.io/tls Secret of cert-manager); the URL's path
//	                             is the method (/pkg.Service/Method). Prints "grpc-status N
//	                             MESSAGE" and exits 0 when the server answered with a gRPC
//	                             status, whichever; exits 1 when no status came back (TLS
//	                             refused, connection failed, not gRPC)
//
// Static (CGO_ENABLED=0), so the image is this file alone; Go's own resolver reads the
// /etc/resolv.conf the kubelet writes into the pod.
package main

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/signal"
	"path/filepath"
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
	case len(args) == 3 && args[0] == "tcp":
		timeout, err := time.ParseDuration(args[2])
		if err != nil {
			return fmt.Errorf("timeout %q: %w", args[2], err)
		}
		return dial(args[1], timeout)
	case len(args) == 4 && args[0] == "grpc":
		timeout, err := time.ParseDuration(args[3])
		if err != nil {
			return fmt.Errorf("timeout %q: %w", args[3], err)
		}
		return grpcCall(args[1], args[2], timeout)
	default:
		return errors.New("usage: probe serve <port> | probe get <url> <timeout> | probe tcp <host:port> <timeout> | probe grpc <url> <tls dir> <timeout>")
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

func dial(addr string, timeout time.Duration) error {
	conn, err := net.DialTimeout("tcp", addr, timeout)
	if err != nil {
		return err
	}
	return conn.Close()
}

func grpcCall(url, dir string, timeout time.Duration) error {
	cert, err := tls.LoadX509KeyPair(filepath.Join(dir, "tls.crt"), filepath.Join(dir, "tls.key"))
	if err != nil {
		return fmt.Errorf("the client certificate: %w", err)
	}
	caPEM, err := os.ReadFile(filepath.Join(dir, "ca.crt"))
	if err != nil {
		return fmt.Errorf("the CA: %w", err)
	}
	roots := x509.NewCertPool()
	if !roots.AppendCertsFromPEM(caPEM) {
		return fmt.Errorf("no certificate in %s", filepath.Join(dir, "ca.crt"))
	}
	client := &http.Client{
		Timeout: timeout,
		Transport: &http.Transport{
			TLSClientConfig:   &tls.Config{Certificates: []tls.Certificate{cert}, RootCAs: roots, MinVersion: tls.VersionTLS13},
			ForceAttemptHTTP2: true,
		},
	}
	// A gRPC frame: not compressed, length 0 (the empty message).
	req, err := http.NewRequest(http.MethodPost, url, bytes.NewReader([]byte{0, 0, 0, 0, 0}))
	if err != nil {
		return err
	}
	req.Header.Set("content-type", "application/grpc")
	req.Header.Set("te", "trailers")
	resp, err := client.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if resp.ProtoMajor != 2 {
		return fmt.Errorf("%s answered over HTTP/%d.%d, not HTTP/2", url, resp.ProtoMajor, resp.ProtoMinor)
	}
	if _, err := io.Copy(io.Discard, io.LimitReader(resp.Body, 1<<20)); err != nil {
		return fmt.Errorf("reading the answer: %w", err)
	}
	// A status comes in the trailers, or in the headers of a trailers-only answer.
	status, message := resp.Trailer.Get("grpc-status"), resp.Trailer.Get("grpc-message")
	if status == "" {
		status, message = resp.Header.Get("grpc-status"), resp.Header.Get("grpc-message")
	}
	if status == "" {
		return fmt.Errorf("%s answered HTTP %d without a grpc-status", url, resp.StatusCode)
	}
	fmt.Printf("grpc-status %s %s\n", status, message)
	return nil
}
