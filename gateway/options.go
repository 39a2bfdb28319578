package gateway

import (
	"log/slog"
	"net/http"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/rationhq/ration/spender/spenderhttp"
)

// Option configures New. Options apply in order; a later one overrides an
// earlier one.
type Option interface {
	apply(*config)
}

type config struct {
	registry    *prometheus.Registry
	logger      *slog.Logger
	counter     spenderhttp.Counter
	limitOpts   []spenderhttp.Option
	transport   http.RoundTripper
	upstreamKey string
	accessLog   bool
}

func newConfig(opts []Option) config {
	c := config{logger: slog.New(slog.DiscardHandler)}
	for _, o := range opts {
		if o != nil {
			o.apply(&c)
		}
	}
	if c.registry == nil {
		c.registry = prometheus.NewRegistry()
	}
	if c.transport == nil {
		c.transport = NewUpstreamTransport(DefaultUpstreamConns)
	}
	return c
}

type optionFunc func(*config)

func (f optionFunc) apply(c *config) { f(c) }

// WithRegistry sets the Prometheus registry the gateway registers its
// metrics on and serves at /metrics. Pass the same registry to the
// Limiter's metrics to serve both. The default is a new registry per
// gateway (never the global one); nil keeps it.
func WithRegistry(reg *prometheus.Registry) Option {
	return optionFunc(func(c *config) {
		if reg != nil {
			c.registry = reg
		}
	})
}

// WithLogger sets where the gateway and its limit stage log. The default
// discards; nil keeps it.
func WithLogger(l *slog.Logger) Option {
	return optionFunc(func(c *config) {
		if l != nil {
			c.logger = l
		}
	})
}

// WithCounter sets the tokenizer the limit stage counts prompts with,
// e.g. spenderhttp.TokenizeCounter{BaseURL: upstream}, or
// tiktokencount.New(that) to count OpenAI models' prompts in-process. The
// default, nil, counts ceil(bytes/4).
func WithCounter(c spenderhttp.Counter) Option {
	return optionFunc(func(cfg *config) { cfg.counter = c })
}

// WithLimitOptions adds options for the limit stage
// (spenderhttp.Middleware), after the gateway's own WithLogger. The
// default is none.
func WithLimitOptions(opts ...spenderhttp.Option) Option {
	return optionFunc(func(c *config) { c.limitOpts = append(c.limitOpts, opts...) })
}

// WithTransport sets how the proxy reaches the upstream. The default is
// NewUpstreamTransport(DefaultUpstreamConns), one per gateway; nil keeps
// it. Give the tokenize counter (spenderhttp.TokenizeCounter.Client) the
// same transport so both share one pool of connections to the engine.
func WithTransport(t http.RoundTripper) Option {
	return optionFunc(func(c *config) {
		if t != nil {
			c.transport = t
		}
	})
}

// WithUpstreamKey sets the bearer token sent to the upstream engine in
// place of the client's key. The default, "", sends no Authorization.
func WithUpstreamKey(key string) Option {
	return optionFunc(func(c *config) { c.upstreamKey = key })
}

// WithAccessLog makes the gateway log one line per /v1/ request at INFO
// on its logger (WithLogger), once the answer is done: method, path, the
// key's id (never its secret), status, response bytes, duration, and
// whether the limit stage admitted the request or which budget refused
// it. The default logs no request.
func WithAccessLog(on bool) Option {
	return optionFunc(func(c *config) { c.accessLog = on })
}
