package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"time"

	"connectrpc.com/connect/v2"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/rationhq/ration"
	"github.com/rationhq/ration/allocator"
	leasev1 "github.com/rationhq/ration/proto/ration/lease/v1"
	"github.com/rationhq/ration/spender"
	bolterrors "go.etcd.io/bbolt/errors"
)

// newLimiter builds gateway instance i's Limiter, spending leases from
// source: every instance then admits only what the allocator granted it
// out of each key's global budget. Its metrics go to reg (the instance's
// /metrics), with, for a remote allocator, the leader its client follows.
// Its spender id is id, unique among every spender of the allocator (see
// spenderID). This is the one place that decides how instances limit.
func newLimiter(i int, id string, source *leaseSource, clock ration.Clock, reg prometheus.Registerer, log *slog.Logger) (*spender.Limiter, error) {
	m, err := spender.NewMetrics(reg)
	if err != nil {
		return nil, err
	}
	log = log.With("instance", i+1, "spender", id)
	src, err := source.forInstance(m, log)
	if err != nil {
		return nil, err
	}
	return spender.New(clock,
		spender.WithLeases(src),
		spender.WithSpenderID(id),
		spender.WithMetrics(m),
		spender.WithLogger(log),
	)
}

// leaseSource is where the instances get leases, and how to let go of it.
type leaseSource struct {
	src    spender.LeaseSource
	ledger *allocator.Ledger // the embedded allocator's; nil for a remote one
	desc   string            // for the banner
	close  func() error      // closes the embedded ledger; nil for a remote one
	// dial makes another client of the remote allocator (nil for the
	// embedded one), so that each instance has its own, as separate
	// gateways would, and records the leader it follows in its metrics.
	dial func(...spender.SourceOption) (spender.LeaseSource, error)
}

// forInstance is the LeaseSource of one instance, whose metrics are m:
// the embedded allocator's service, shared; or a client of the remote
// allocator of its own, recording its leader redirects into m.
func (s *leaseSource) forInstance(m *spender.Metrics, log *slog.Logger) (spender.LeaseSource, error) {
	if s.dial == nil {
		return s.src, nil
	}
	return s.dial(spender.WithSourceMetrics(m), spender.WithSourceLogger(log))
}

// openLeaseSource opens the embedded allocator (a bbolt ledger in
// cfg.dataDir, served in process) or a client of the remote one at
// cfg.allocatorURL.
func openLeaseSource(ctx context.Context, cfg config, clock ration.Clock, log *slog.Logger) (*leaseSource, error) {
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
		led.SweepEvery(sweepCtx, max(cfg.leaseTTL, time.Second), log.With("component", "allocator"))
	}()
	return &leaseSource{
		src:    allocator.NewService(led, allocator.WithServiceLogger(log.With("component", "allocator"))),
		ledger: led,
		desc:   "embedded, ledger in " + path,
		close: func() error {
			stopSweep()
			<-swept
			return led.Close()
		},
	}, nil
}

// checkToken makes one cheap authenticated call to a remote allocator, so
// that a token it refuses stops the start with a clear error instead of
// turning every request into a fallback 429. The call is a Release of
// nothing by a one-off spender id (PREFIX/token-check): it holds nothing
// and closes its own epoch. An allocator that cannot be reached is only
// logged: the gateways start and follow their fallback policy until it
// answers.
func (s *leaseSource) checkToken(ctx context.Context, prefix string, cfg config, log *slog.Logger) error {
	if s.ledger != nil {
		return nil // embedded: in process, no token
	}
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	_, err := s.src.Release(ctx, &leasev1.ReleaseRequest{Caller: &leasev1.Caller{
		SpenderId: prefix + "/token-check", Epoch: uint64(time.Now().UnixNano()), Sequence: 1}})
	switch connect.CodeOf(err) {
	case connect.CodeUnauthenticated:
		return fmt.Errorf("-allocator %s refused the token in -token-file %s: %w", cfg.allocatorURL, cfg.tokenFile, err)
	case connect.CodePermissionDenied:
		// A spender id is the token's that first used it.
		return fmt.Errorf("-allocator %s: the spender ids %s-* belong to another token than -token-file %s's; give this gateway its own -spender-id: %w",
			cfg.allocatorURL, prefix, cfg.tokenFile, err)
	}
	if err != nil {
		log.Warn("gateway-demo: allocator not reachable at start; the gateways follow their fallback policy until it answers",
			"allocator", cfg.allocatorURL, "err", err)
	}
	return nil
}

// remoteSource is a client of cmd/allocator at cfg.allocatorURL, one URL
// or a cluster's members comma-separated (h2c for http://, HTTP/2 over TLS
// for https://), authenticated with the first token of cfg.tokenFile.
func remoteSource(cfg config) (*leaseSource, error) {
	dial := func(opts ...spender.SourceOption) (spender.LeaseSource, error) {
		src, err := spender.DialAllocator(cfg.allocatorURL, append([]spender.SourceOption{spender.WithTokenFile(cfg.tokenFile)}, opts...)...)
		if err != nil {
			return nil, fmt.Errorf("-allocator: %w", err)
		}
		return src, nil
	}
	src, err := dial()
	if err != nil {
		return nil, err
	}
	return &leaseSource{src: src, dial: dial, desc: "remote, " + cfg.allocatorURL}, nil
}
