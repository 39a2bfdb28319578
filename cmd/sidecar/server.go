package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"github.com/rationhq/ration"
	"github.com/rationhq/ration/allocator"
	"github.com/rationhq/ration/sidecar"
	"github.com/rationhq/ration/spender"
)

// deps are what the process provides and tests replace.
type deps struct {
	clock  ration.Clock      // nil: the system clock
	logOut io.Writer         // logs
	hup    <-chan os.Signal  // SIGHUP: reload the rate limit configuration; nil: none
	ready  func(addr string) // tests: called with the listener's address once serving
}

// run serves until ctx is done, then drains, settles what it holds and
// returns every lease.
func run(ctx context.Context, cfg config, d deps) error {
	if d.clock == nil {
		d.clock = ration.SystemClock{}
	}
	log := newLogger(cfg, d.logOut)
	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))

	var rls *sidecar.Config
	if cfg.rlsConfig != "" {
		var err error
		if rls, err = sidecar.LoadConfig(cfg.rlsConfig); err != nil {
			return err
		}
		log.Info("sidecar: rate limit configuration loaded", "dir", cfg.rlsConfig, "domains", rls.Domains())
	}
	src, err := openSource(ctx, cfg, d.clock, reg, log)
	if err != nil {
		return err
	}
	defer src.close()
	lim, err := src.limiter(cfg, d.clock)
	if err != nil {
		return err
	}
	sm, err := sidecar.NewMetrics(reg)
	if err != nil {
		return errors.Join(err, lim.Close(ctx))
	}
	svc, err := sidecar.New(lim, sidecar.WithClock(d.clock), sidecar.WithHold(cfg.hold), sidecar.WithMaxOpen(cfg.maxOpen),
		sidecar.WithLogger(log), sidecar.WithMetrics(sm))
	if err != nil {
		return errors.Join(err, lim.Close(ctx))
	}
	if rls != nil {
		svc.SetConfig(rls)
	}

	ln, err := listen(cfg)
	if err != nil {
		return errors.Join(err, lim.Close(ctx))
	}
	var stopping atomic.Bool
	mux := http.NewServeMux()
	sidecar.Mount(mux, svc)
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) { io.WriteString(w, "ok\n") })
	mux.HandleFunc("GET /readyz", func(w http.ResponseWriter, _ *http.Request) {
		switch err := lim.Ready(); {
		case stopping.Load():
			http.Error(w, "not ready: shutting down", http.StatusServiceUnavailable)
		case err != nil:
			http.Error(w, "not ready: "+err.Error(), http.StatusServiceUnavailable)
		default:
			io.WriteString(w, "ready\n")
		}
	})
	mux.Handle("GET /metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{Registry: reg}))

	p := new(http.Protocols)
	p.SetHTTP1(true)            // curl and the Connect JSON clients
	p.SetUnencryptedHTTP2(true) // Envoy's gRPC client (prior-knowledge h2c) and gRPC clients
	srv := &http.Server{Handler: mux, Protocols: p, ErrorLog: slog.NewLogLogger(log.Handler(), slog.LevelWarn)}
	cfg.limits.Apply(srv)
	served := make(chan error, 1)
	go func() { served <- srv.Serve(ln) }()
	log.Info("sidecar: listening", "addr", ln.Addr().String(), "allocator", src.desc, "hold", cfg.hold.String())
	if d.ready != nil {
		d.ready(ln.Addr().String())
	}

	stopReload := watchConfig(cfg, svc, d.hup, log)
	var serveErr error
	select {
	case <-ctx.Done():
	case serveErr = <-served:
	}
	log.Info("sidecar: shutting down")
	stopping.Store(true)
	stopReload()
	drainCtx, cancel := context.WithTimeout(context.Background(), cfg.drain)
	defer cancel()
	if err := srv.Shutdown(drainCtx); err != nil {
		log.Warn("sidecar: drain incomplete", "err", err)
		srv.Close()
	}
	held := svc.Open()
	svc.Close()
	closeCtx, cancelClose := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancelClose()
	if err := lim.Close(closeCtx); err != nil {
		return errors.Join(serveErr, fmt.Errorf("returning the leases: %w", err))
	}
	log.Info("sidecar: stopped; every lease returned", "settled_at_reserved_cost", held)
	if errors.Is(serveErr, http.ErrServerClosed) {
		serveErr = nil
	}
	return serveErr
}

func newLogger(cfg config, w io.Writer) *slog.Logger {
	if w == nil {
		return slog.New(slog.DiscardHandler)
	}
	opts := &slog.HandlerOptions{Level: cfg.logLevel}
	if cfg.logJSON {
		return slog.New(slog.NewJSONHandler(w, opts))
	}
	return slog.New(slog.NewTextHandler(w, opts))
}

// listen opens -listen: TCP, or a unix socket with -unix-socket-mode
// (a socket file left by a process that is gone is replaced).
func listen(cfg config) (net.Listener, error) {
	path, ok := strings.CutPrefix(cfg.listen, "unix:")
	if !ok {
		ln, err := net.Listen("tcp", cfg.listen)
		if err != nil {
			return nil, fmt.Errorf("-listen: %w", err)
		}
		return ln, nil
	}
	if fi, err := os.Lstat(path); err == nil && fi.Mode().Type() == fs.ModeSocket {
		if c, err := net.Dial("unix", path); err == nil {
			c.Close()
			return nil, fmt.Errorf("-listen %s: another process is serving on it", cfg.listen)
		}
		os.Remove(path)
	}
	ln, err := net.Listen("unix", path)
	if err != nil {
		return nil, fmt.Errorf("-listen: %w", err)
	}
	if err := os.Chmod(path, fs.FileMode(cfg.unixSocketMode)); err != nil {
		ln.Close()
		return nil, fmt.Errorf("-listen: %w", err)
	}
	return ln, nil
}

// source is where the Limiter's leases come from.
type source struct {
	src   spender.LeaseSource
	m     *spender.Metrics
	log   *slog.Logger
	desc  string
	close func() // closes the embedded allocator; nothing for a remote one
}

// openSource opens the embedded allocator (a bbolt ledger in -data-dir,
// served in process, as cmd/gateway-demo embeds one) or a client of the
// allocator cluster at -allocator.
func openSource(ctx context.Context, cfg config, clock ration.Clock, reg *prometheus.Registry, log *slog.Logger) (*source, error) {
	m, err := spender.NewMetrics(reg)
	if err != nil {
		return nil, err
	}
	if !cfg.embedded {
		src, err := spender.DialAllocator(cfg.allocatorURL, spender.WithTokenFile(cfg.tokenFile),
			spender.WithSourceMetrics(m), spender.WithSourceLogger(log))
		if err != nil {
			return nil, fmt.Errorf("-allocator: %w", err)
		}
		return &source{src: src, m: m, log: log, desc: cfg.allocatorURL, close: func() {}}, nil
	}
	if err := os.MkdirAll(cfg.dataDir, 0o700); err != nil {
		return nil, fmt.Errorf("-data-dir: %w", err)
	}
	path := filepath.Join(cfg.dataDir, "allocator.db")
	alog := log.With("component", "allocator")
	led, err := allocator.Open(path, allocator.WithClock(clock), allocator.WithTTL(cfg.leaseTTL), allocator.WithLogger(alog))
	if err != nil {
		return nil, fmt.Errorf("-data-dir: %w (is another sidecar using %s?)", err, cfg.dataDir)
	}
	if err := allocator.RegisterLedger(reg, led); err != nil {
		led.Close()
		return nil, err
	}
	sweepCtx, stopSweep := context.WithCancel(context.WithoutCancel(ctx))
	swept := make(chan struct{})
	go func() { // drop idle keys and sessions, as cmd/allocator does
		defer close(swept)
		led.SweepEvery(sweepCtx, max(cfg.leaseTTL, time.Second), alog)
	}()
	return &source{src: allocator.NewService(led, allocator.WithServiceLogger(alog)), m: m, log: log,
		desc: "embedded, ledger in " + path,
		close: func() {
			stopSweep()
			<-swept
			if err := led.Close(); err != nil {
				alog.Warn("sidecar: closing the embedded allocator", "err", err)
			}
		}}, nil
}

// limiter is the leased Limiter on s.
func (s *source) limiter(cfg config, clock ration.Clock) (*spender.Limiter, error) {
	opts := []spender.Option{spender.WithLeases(s.src), spender.WithMetrics(s.m), spender.WithLogger(s.log)}
	if cfg.spenderID != "" {
		opts = append(opts, spender.WithSpenderID(cfg.spenderID))
	}
	return spender.New(clock, opts...)
}

// watchConfig reloads -ratelimit-config on each SIGHUP and, every
// -ratelimit-config-reload-interval, when its files changed. A
// configuration that does not load is logged and the one in force stays.
// It returns the function that stops watching.
func watchConfig(cfg config, svc *sidecar.Service, hup <-chan os.Signal, log *slog.Logger) func() {
	done := make(chan struct{})
	stopped := make(chan struct{})
	go func() {
		defer close(stopped)
		var tick <-chan time.Time
		if cfg.rlsConfig != "" && cfg.rlsReload > 0 {
			t := time.NewTicker(cfg.rlsReload)
			defer t.Stop()
			tick = t.C
		}
		var last [32]byte
		if c := svc.Config(); c != nil {
			last = c.Sum()
		}
		lastErr := "" // a configuration that keeps failing is logged once per new error
		for {
			signalled := false
			select {
			case <-done:
				return
			case <-hup:
				signalled = true
			case <-tick:
			}
			if cfg.rlsConfig == "" {
				log.Warn("sidecar: SIGHUP, but there is no -ratelimit-config to reload")
				continue
			}
			c, err := sidecar.LoadConfig(cfg.rlsConfig)
			switch {
			case err != nil:
				if err.Error() != lastErr || signalled {
					log.Error("sidecar: the rate limit configuration did not load; the one in force stays", "dir", cfg.rlsConfig, "err", err)
				}
				lastErr = err.Error()
			case c.Sum() != last || signalled:
				last, lastErr = c.Sum(), ""
				svc.SetConfig(c)
				log.Info("sidecar: rate limit configuration reloaded", "dir", cfg.rlsConfig, "domains", c.Domains())
			}
		}
	}()
	return func() { close(done); <-stopped }
}
