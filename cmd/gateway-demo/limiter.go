package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"time"

	"connectrpc.com/connect/v2"
	"connectrpc.com/connect/v2/connecthttp"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/rationhq/ration/allocator"
	"github.com/rationhq/ration/proto/ration/lease/v1/leasev1connect"
	"github.com/rationhq/ration/spender"
	bolterrors "go.etcd.io/bbolt/errors"
)

// newLimiter builds gateway instance i's Limiter, spending leases from
// src: every instance then admits only what the allocator granted it
// out of each key's global budget. Its metrics go to reg (the instance's
// /metrics). This is the one place that decides how instances limit.
func newLimiter(i int, src spender.LeaseSource, clock spender.Clock, reg prometheus.Registerer, log *slog.Logger) (*spender.Limiter, error) {
	m, err := spender.NewMetrics(reg)
	if err != nil {
		return nil, err
	}
	return spender.New(clock,
		spender.WithLeases(src),
		spender.WithSpenderID(fmt.Sprintf("gateway-demo-%d", i+1)),
		spender.WithMetrics(m),
		spender.WithLogger(log.With("instance", i+1)),
	), nil
}

// leaseSource is where the instances get leases, and how to let go of it.
type leaseSource struct {
	src   spender.LeaseSource
	desc  string       // for the banner
	close func() error // closes the embedded ledger; nil for a remote one
}

// openLeaseSource opens the embedded allocator (a bbolt ledger in
// cfg.dataDir, served in process) or a client of the remote one at
// cfg.allocatorURL.
func openLeaseSource(ctx context.Context, cfg config, clock spender.Clock, log *slog.Logger) (*leaseSource, error) {
	if cfg.allocatorURL != "" {
		return remoteSource(cfg)
	}
	if err := os.MkdirAll(cfg.dataDir, 0o700); err != nil {
		return nil, fmt.Errorf("data directory: %w", err)
	}
	path := filepath.Join(cfg.dataDir, "allocator.db")
	led, err := allocator.Open(path, allocator.WithClock(clock), allocator.WithTTL(cfg.leaseTTL),
		allocator.WithLogger(log.With("component", "allocator")))
	if err != nil {
		if errors.Is(err, bolterrors.ErrTimeout) {
			return nil, fmt.Errorf("%w (is another gateway-demo using %s? pass -data DIR)", err, cfg.dataDir)
		}
		return nil, err
	}
	sweepCtx, stopSweep := context.WithCancel(ctx)
	swept := make(chan struct{})
	go func() { // drop idle keys and sessions, as cmd/allocator does
		defer close(swept)
		t := time.NewTicker(max(cfg.leaseTTL, time.Second))
		defer t.Stop()
		for {
			select {
			case <-sweepCtx.Done():
				return
			case <-t.C:
				if _, _, err := led.Sweep(sweepCtx); err != nil && sweepCtx.Err() == nil {
					log.Warn("gateway-demo: allocator sweep", "err", err)
				}
			}
		}
	}()
	return &leaseSource{
		src:  allocator.NewService(led, allocator.WithServiceLogger(log.With("component", "allocator"))),
		desc: "embedded, ledger in " + path,
		close: func() error {
			stopSweep()
			<-swept
			return led.Close()
		},
	}, nil
}

// remoteSource is a Connect client of cmd/allocator: h2c for http://,
// HTTP/2 over TLS for https://, with the token file's first token as
// bearer.
func remoteSource(cfg config) (*leaseSource, error) {
	tokens, err := allocator.ReadTokenFile(cfg.tokenFile)
	if err != nil {
		return nil, err
	}
	base, err := parseAllocatorURL(cfg.allocatorURL)
	if err != nil {
		return nil, err
	}
	tr := &http.Transport{ForceAttemptHTTP2: true}
	if base.Scheme == "http" {
		p := new(http.Protocols)
		p.SetUnencryptedHTTP2(true) // h2c only: with HTTP/1 also set the client silently uses HTTP/1.1
		tr = &http.Transport{Protocols: p}
	}
	hc := &http.Client{Transport: bearerTransport{base: tr, token: tokens[0]}}
	client := leasev1connect.NewLeaseServiceClient(connect.NewClient(connecthttp.NewTransport(hc, base.String())))
	return &leaseSource{src: client, desc: "remote, " + base.String()}, nil
}

// bearerTransport adds the allocator's bearer token to every call.
type bearerTransport struct {
	base  http.RoundTripper
	token string
}

func (b bearerTransport) RoundTrip(r *http.Request) (*http.Response, error) {
	r = r.Clone(r.Context())
	r.Header.Set("Authorization", "Bearer "+b.token)
	return b.base.RoundTrip(r)
}

// parseAllocatorURL checks -allocator: an absolute http or https URL.
func parseAllocatorURL(raw string) (*url.URL, error) {
	u, err := url.Parse(raw)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return nil, fmt.Errorf("-allocator %q: want http://host:port or https://host:port", raw)
	}
	return u, nil
}
