package main

import (
	"bytes"
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"sync/atomic"
	"time"

	"connectrpc.com/connect/v2"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"github.com/rationhq/ration"
	"github.com/rationhq/ration/allocator"
	"github.com/rationhq/ration/allocator/cluster"
	"github.com/rationhq/ration/gateway"
	leasev1 "github.com/rationhq/ration/proto/ration/lease/v1"
)

// run serves until ctx is done, then drains and closes the store.
func run(ctx context.Context, cfg config, logOut io.Writer) error {
	log := newLogger(cfg, logOut)
	// GOMAXPROCS is the runtime's (docs/allocator.md, Operations).
	log.Info("allocator: GOMAXPROCS", "procs", runtime.GOMAXPROCS(0), "numcpu", runtime.NumCPU())
	ln, err := net.Listen("tcp", cfg.listen)
	if err != nil {
		return err
	}
	return serve(ctx, cfg, ln, log)
}

func newLogger(cfg config, w io.Writer) *slog.Logger {
	opts := &slog.HandlerOptions{Level: cfg.logLevel}
	if cfg.logJSON {
		return slog.New(slog.NewJSONHandler(w, opts))
	}
	return slog.New(slog.NewTextHandler(w, opts))
}

// gate is the lease service until the ledger is open: calls before that,
// and after shutdown began, get CodeUnavailable.
type gate struct {
	svc atomic.Pointer[allocator.Service]
}

var errNotReady = connect.NewError(connect.CodeUnavailable, "allocator: not ready")

func (g *gate) Acquire(ctx context.Context, r *leasev1.AcquireRequest) (*leasev1.AcquireResponse, error) {
	if s := g.svc.Load(); s != nil {
		return s.Acquire(ctx, r)
	}
	return nil, errNotReady
}

func (g *gate) ReserveAhead(ctx context.Context, r *leasev1.ReserveAheadRequest) (*leasev1.ReserveAheadResponse, error) {
	if s := g.svc.Load(); s != nil {
		return s.ReserveAhead(ctx, r)
	}
	return nil, errNotReady
}

func (g *gate) Release(ctx context.Context, r *leasev1.ReleaseRequest) (*leasev1.ReleaseResponse, error) {
	if s := g.svc.Load(); s != nil {
		return s.Release(ctx, r)
	}
	return nil, errNotReady
}

// AtQuota is the service's (allocator.Mount refuses the calls of a
// credential at its quota before reading them); none before it is open.
func (g *gate) AtQuota(cred string) bool {
	s := g.svc.Load()
	return s != nil && s.AtQuota(cred)
}

// serve runs the allocator on ln until ctx is done.
func serve(ctx context.Context, cfg config, ln net.Listener, log *slog.Logger) error {
	var interceptors []connect.ServerInterceptor
	creds, err := readCredentials(cfg)
	if err != nil {
		ln.Close()
		return err
	}
	if !cfg.noAuth {
		interceptors = append(interceptors, allocator.BearerAuth(creds.gateway, log))
	} else {
		log.Warn("allocator: authentication disabled (-no-auth)")
	}

	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	metrics, err := allocator.NewMetrics(reg)
	if err != nil {
		ln.Close()
		return err
	}

	g := &gate{}
	var ready atomic.Bool
	var commits commitHealth
	var node atomic.Pointer[cluster.Node] // a cluster member's, once open
	mux := http.NewServeMux()
	allocator.Mount(mux, g, interceptors...)
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) { io.WriteString(w, "ok\n") })
	mux.HandleFunc("GET /readyz", func(w http.ResponseWriter, _ *http.Request) {
		if !ready.Load() {
			http.Error(w, "not ready", http.StatusServiceUnavailable)
			return
		}
		if err := commits.err(); err != nil {
			http.Error(w, "not ready: the last commit failed: "+err.Error(), http.StatusServiceUnavailable)
			return
		}
		if nd := node.Load(); nd != nil {
			// A member serves when it leads, or follows a leader it has
			// nearly caught up with (it then names the leader to callers).
			if err := nd.Ready(); err != nil {
				http.Error(w, "not ready: "+err.Error(), http.StatusServiceUnavailable)
				return
			}
		}
		io.WriteString(w, "ready\n")
	})
	mux.Handle("GET /metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{Registry: reg}))
	var adminAPI atomic.Pointer[http.Handler] // a cluster member's, once open
	if cfg.cluster.on() {
		var h http.Handler = http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if a := adminAPI.Load(); a != nil {
				(*a).ServeHTTP(w, r)
				return
			}
			http.Error(w, "allocator: not ready", http.StatusServiceUnavailable)
		})
		if !cfg.noAuth {
			h = allocator.RequireBearer(creds.admin, log, h)
		}
		mux.Handle("/admin/", h)
	}

	protocols := new(http.Protocols)
	protocols.SetHTTP1(true)
	// A durable reply waits for its group commit, so streams stay open
	// longer than for a stateless service: allow more than the default 100
	// per connection (many spenders may share a proxy's connection).
	srv := &http.Server{Handler: wholeBody(mux), Protocols: protocols,
		HTTP2:    &http.HTTP2Config{MaxConcurrentStreams: 1024},
		ErrorLog: slog.NewLogLogger(log.Handler(), slog.LevelWarn)}
	cfg.limits.Apply(srv)
	tlsOn := cfg.tlsCert != ""
	if tlsOn {
		protocols.SetHTTP2(true)
		cert, err := tls.LoadX509KeyPair(cfg.tlsCert, cfg.tlsKey)
		if err != nil {
			ln.Close()
			return fmt.Errorf("tls: %w", err)
		}
		srv.TLSConfig = &tls.Config{Certificates: []tls.Certificate{cert}, MinVersion: tls.VersionTLS12}
	} else {
		protocols.SetUnencryptedHTTP2(true)
	}

	serveErr := make(chan error, 1)
	go func() {
		var err error
		if tlsOn {
			err = srv.ServeTLS(ln, "", "")
		} else {
			err = srv.Serve(ln)
		}
		serveErr <- err
	}()
	log.Info("allocator: listening", "addr", ln.Addr().String(), "tls", tlsOn)

	// Open and recover the store while /healthz already answers.
	if err := os.MkdirAll(cfg.dataDir, 0o700); err != nil {
		srv.Close()
		return err
	}
	opts := []allocator.Option{allocator.WithTTL(cfg.leaseTTL), allocator.WithStrict(cfg.strict), allocator.WithLogger(log),
		allocator.WithSessionRetention(cfg.sessionRetention), allocator.WithCommitLinger(cfg.commitLinger), allocator.WithQuota(cfg.quota)}
	if cfg.limitsFile != "" {
		kr, err := gateway.LoadKeys(cfg.limitsFile)
		if err != nil {
			srv.Close()
			return fmt.Errorf("-limits-file: %w", err)
		}
		held := kr.Budgets()
		opts = append(opts, allocator.WithKeyLimits(func(key string) (ration.Limits, bool) { lim, ok := held[key]; return lim, ok }))
		log.Info("allocator: holding the fleet's limits", "file", cfg.limitsFile, "budgets", len(held))
	}
	var led *allocator.Ledger
	var member *allocator.Member // a cluster member's Ledger; nil alone
	var peers *cluster.StreamLayer
	if cfg.cluster.on() {
		if member, peers, err = openMember(cfg, creds.peer, reg, log, opts); err == nil {
			led = member.Ledger
		}
	} else {
		led, err = allocator.Open(filepath.Join(cfg.dataDir, "allocator.db"), append(opts,
			allocator.WithCommitObserver(func(d time.Duration, err error) {
				metrics.ObserveCommit(d, err)
				commits.observe(err)
				if cfg.onCommit != nil {
					cfg.onCommit()
				}
			}))...)
	}
	if err != nil {
		srv.Close()
		return err
	}
	if err := allocator.RegisterLedger(reg, led); err != nil {
		srv.Close()
		led.Close()
		return err
	}
	if member != nil {
		node.Store(member.Node())
		a := adminHandler(member, peers, cfg.cluster.peers.urls(), log)
		adminAPI.Store(&a)
	}
	g.svc.Store(allocator.NewService(led, allocator.WithMetrics(metrics), allocator.WithServiceLogger(log)))
	ready.Store(true)
	log.Info("allocator: serving", "lease_ttl", cfg.leaseTTL.String(), "strict", cfg.strict, "cluster_id", cfg.cluster.id) // "10s", not nanoseconds in JSON logs
	// A member is ready once it follows a leader (watchMember says when);
	// it stops when it learns that it was removed from the cluster.
	var removed <-chan error // never, alone
	stopWatch := func() {}
	if nd := node.Load(); nd != nil {
		removed, stopWatch = startWatch(nd, log)
	} else {
		log.Info("allocator: ready")
	}

	sweepDone := make(chan struct{})
	sweepCtx, stopSweep := context.WithCancel(context.Background())
	go func() {
		defer close(sweepDone)
		led.SweepEvery(sweepCtx, cfg.sweepInterval, log)
	}()

	var runErr error
	select {
	case <-ctx.Done():
	case runErr = <-serveErr:
	case runErr = <-removed:
	}
	stopWatch()
	log.Info("allocator: shutting down")
	ready.Store(false)
	sctx, cancel := context.WithTimeout(context.Background(), cfg.shutdownTimeout)
	defer cancel()
	if err := srv.Shutdown(sctx); err != nil {
		log.Warn("allocator: drain incomplete", "err", err)
		srv.Close()
	}
	stopSweep()
	<-sweepDone
	g.svc.Store(nil)
	handOver(node.Load(), log)
	if err := led.Close(); err != nil {
		return errors.Join(runErr, fmt.Errorf("close store: %w", err))
	}
	log.Info("allocator: stopped")
	if errors.Is(runErr, http.ErrServerClosed) {
		runErr = nil
	}
	return runErr
}

// maxCallBytes caps one call's request body; a lease call is a few KiB.
const maxCallBytes = 16 << 20

// wholeBody reads each lease call's body before h sees it, as it arrives
// (never sized from Content-Length) and up to maxCallBytes, so that a body
// slower than -read-timeout is answered 408 and the connection closed,
// where the RPC layer would answer 504 as if the allocator were late; a
// larger one is 413.
func wholeBody(h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Body == nil || r.Body == http.NoBody || strings.HasPrefix(r.URL.Path, "/admin/") {
			// A backup to restore may be larger than any call: the
			// admin API bounds its own bodies.
			h.ServeHTTP(w, r)
			return
		}
		body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, maxCallBytes))
		var tooLarge *http.MaxBytesError
		switch {
		case errors.As(err, &tooLarge):
			w.Header().Set("Connection", "close")
			http.Error(w, "allocator: request body over 16 MiB", http.StatusRequestEntityTooLarge)
			return
		case errors.Is(err, os.ErrDeadlineExceeded):
			w.Header().Set("Connection", "close")
			http.Error(w, "allocator: request body did not arrive within -read-timeout", http.StatusRequestTimeout)
			return
		case err != nil:
			w.Header().Set("Connection", "close")
			http.Error(w, "allocator: reading the request body: "+err.Error(), http.StatusBadRequest)
			return
		}
		r.Body = io.NopCloser(bytes.NewReader(body))
		h.ServeHTTP(w, r)
	})
}

// commitHealth is the result of the store's last commit attempt, for
// /readyz: an allocator that cannot commit answers no call, so it is not
// ready until a commit succeeds again (a retried call, or the periodic
// sweep, tries one).
type commitHealth struct {
	last atomic.Pointer[error] // nil: the last commit succeeded (or none was tried)
}

func (h *commitHealth) observe(err error) {
	if err == nil {
		h.last.Store(nil)
		return
	}
	h.last.Store(&err)
}

func (h *commitHealth) err() error {
	if p := h.last.Load(); p != nil {
		return *p
	}
	return nil
}
