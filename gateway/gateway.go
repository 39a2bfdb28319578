package gateway

import (
	"fmt"
	"net/http"
	"net/url"

	"github.com/prometheus/client_golang/prometheus/promhttp"
	"github.com/rationhq/ration/internal/oaierror"
	"github.com/rationhq/ration/spender/spenderhttp"
)

// Gateway is one gateway instance: an http.Handler serving
//
//	/v1/...     authenticate, then (POST only) the limit stage, then the
//	            reverse proxy to the upstream
//	/metrics    this instance's Prometheus registry
//	/healthz    200 "ok" while the process serves
//	/readyz     200 "ready", or 503 with the reason while the limiter
//	            says it is not (see Readier)
//
// Make one with New. It is safe for concurrent use.
type Gateway struct {
	mux *http.ServeMux
}

// Readier is a limiter that can say whether it is fit to serve. A leased
// *spender.Limiter is not while its allocator is unreachable (it admits by
// its fallback policy meanwhile) or while another live process uses its
// spender id. The gateway's /readyz asks it; a limiter that is not a
// Readier is always ready.
type Readier interface {
	Ready() error
}

// New returns a gateway that admits requests with limiter (a
// *spender.Limiter, standalone or leased), authenticates with keys (a
// *Keyring, or a *LiveKeys that a KeysReloader swaps) and forwards to
// upstream (see ParseUpstream). It fails only on a nil argument, an
// upstream that is not absolute http(s), or metrics that cannot be
// registered (a registry shared by two gateways).
func New(keys KeySource, limiter spenderhttp.Reserver, upstream *url.URL, opts ...Option) (*Gateway, error) {
	if keys == nil || keys.Current() == nil || limiter == nil {
		return nil, fmt.Errorf("gateway: New needs keys and a limiter")
	}
	if upstream == nil || (upstream.Scheme != "http" && upstream.Scheme != "https") || upstream.Host == "" {
		return nil, fmt.Errorf("%w: %v", ErrBadUpstream, upstream)
	}
	cfg := newConfig(opts)
	m, err := newMetrics(cfg.registry)
	if err != nil {
		return nil, err
	}
	proxy := newProxy(upstream, cfg.transport, cfg.upstreamKey, cfg.logger, m.upstreamErrs.Inc)
	limitOpts := append([]spenderhttp.Option{spenderhttp.WithLogger(cfg.logger), spenderhttp.WithDecisions(noteDecision)}, cfg.limitOpts...)
	limited := spenderhttp.Middleware(limiter, cfg.counter, limitOpts...)(proxy)
	auth := Authenticate(keys, cfg.logger, func(reason string) { m.authFailures.WithLabelValues(reason).Inc() })
	api := auth(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		noteKey(r.Context())
		if r.Method == http.MethodPost {
			limited.ServeHTTP(w, r)
			return
		}
		proxy.ServeHTTP(w, r) // GET /v1/models and friends: authenticated, not counted
	}))

	if cfg.accessLog {
		api = accessLog(cfg.logger, api)
	}
	mux := http.NewServeMux()
	mux.Handle("/v1/", m.instrument(api))
	mux.Handle("GET /metrics", promhttp.HandlerFor(cfg.registry, promhttp.HandlerOpts{ErrorLog: nil}))
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		_, _ = w.Write([]byte("ok\n"))
	})
	mux.HandleFunc("GET /readyz", func(w http.ResponseWriter, _ *http.Request) {
		if rd, ok := limiter.(Readier); ok {
			if err := rd.Ready(); err != nil {
				http.Error(w, "not ready: "+err.Error(), http.StatusServiceUnavailable)
				return
			}
		}
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		_, _ = w.Write([]byte("ready\n"))
	})
	mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		oaierror.Write(w, http.StatusNotFound, oaierror.TypeInvalidRequest, "unknown_url", "",
			"Unknown request URL: "+r.Method+" "+r.URL.Path+". The gateway serves the OpenAI API under /v1/, "+
				"and /metrics, /healthz and /readyz.")
	})
	return &Gateway{mux: mux}, nil
}

// ServeHTTP answers one request.
func (g *Gateway) ServeHTTP(w http.ResponseWriter, r *http.Request) { g.mux.ServeHTTP(w, r) }
