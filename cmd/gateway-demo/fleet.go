package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/url"
	"os"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/rationhq/ration"
	"github.com/rationhq/ration/echo"
	"github.com/rationhq/ration/gateway"
	"github.com/rationhq/ration/internal/serverlimits"
	"github.com/rationhq/ration/spender"
	"github.com/rationhq/ration/spender/spenderhttp"
	"github.com/rationhq/ration/spender/spenderhttp/tiktokencount"
)

// deps are what the process provides and tests replace.
type deps struct {
	clock  ration.Clock     // nil: the system clock
	out    io.Writer        // the banner
	logOut io.Writer        // logs
	hup    <-chan os.Signal // SIGHUP (notifyReload): reload the keys file; nil: none
}

// instance is one running gateway.
type instance struct {
	url     string // http://host:port
	limiter *spender.Limiter
	reg     *prometheus.Registry // what its /metrics serves
	srv     *http.Server
	done    chan error // Serve's result
}

// fleet is everything gateway-demo runs.
type fleet struct {
	cfg       config
	log       *slog.Logger
	keys      gateway.KeySource     // every instance's keys: the reloader's, or the built-in ones
	reloader  *gateway.KeysReloader // keeps keys in step with -keys; nil with the built-in keys
	stopWatch func()                // stops watchKeys and waits for it; nil until it runs
	demoKeys  bool                  // keys are the built-in ones (the banner may print them)
	source    *leaseSource
	engine    *http.Server // nil with -upstream
	engineURL string       // the echo engine's or -upstream's root
	instances []*instance
	spenderID string // the instances' spender id prefix (-spender-id or a unique default)
	// tiktoken counts prompts in-process, with -tokenizer auto or
	// tiktoken; one for the fleet, so each encoding loads once.
	tiktoken *tiktokencount.Counter
}

// run starts the fleet, prints the banner and serves until ctx is done,
// then stops it.
func run(ctx context.Context, cfg config, d deps) error {
	f, err := start(ctx, cfg, d)
	if err != nil {
		return err
	}
	f.banner(d.out)
	<-ctx.Done()
	f.log.Info("gateway-demo: shutting down")
	return f.stop()
}

func newLogger(cfg config, w io.Writer) *slog.Logger {
	if w == nil {
		return slog.New(slog.DiscardHandler)
	}
	return slog.New(slog.NewTextHandler(w, &slog.HandlerOptions{Level: cfg.logLevel}))
}

// start binds every listener, opens the lease source and starts serving.
// On error, whatever started is stopped again.
func start(ctx context.Context, cfg config, d deps) (_ *fleet, err error) {
	if d.clock == nil {
		d.clock = ration.SystemClock{}
	}
	f := &fleet{cfg: cfg, log: newLogger(cfg, d.logOut)}
	defer func() {
		if err != nil {
			f.stop()
		}
	}()
	if err := f.loadKeys(d.clock); err != nil {
		return nil, err
	}
	gwAddrs, engineAddr, err := cfg.addrs()
	if err != nil {
		return nil, err
	}
	listeners := make([]net.Listener, 0, len(gwAddrs))
	for _, a := range gwAddrs {
		ln, err := listen(a)
		if err != nil {
			closeAll(listeners)
			return nil, err
		}
		listeners = append(listeners, ln)
	}

	upstream := cfg.upstream
	if upstream == "" {
		ln, err := listen(engineAddr)
		if err != nil {
			closeAll(listeners)
			return nil, err
		}
		eng := echo.New(echo.WithClock(d.clock), echo.WithTokenDelay(cfg.echoDelay),
			echo.WithLogger(f.log.With("component", "echo")))
		f.engine = newServer(eng, f.cfg.limits, f.log)
		go func() { _ = f.engine.Serve(ln) }()
		upstream = "http://" + ln.Addr().String()
	}
	up, err := gateway.ParseUpstream(upstream)
	if err != nil {
		closeAll(listeners)
		return nil, fmt.Errorf("-upstream: %w", err)
	}
	f.engineURL = up.String()

	if cfg.tokenizer != tokenizerEngine && cfg.tokenizer != tokenizerBytes {
		f.tiktoken = tiktokencount.New(nil)
	}
	if f.spenderID = cfg.spenderID; f.spenderID == "" {
		f.spenderID = defaultSpenderPrefix()
	}
	if f.source, err = openLeaseSource(ctx, cfg, d.clock, f.log); err != nil {
		closeAll(listeners)
		return nil, err
	}
	if err := f.source.checkToken(ctx, f.spenderID, cfg, f.log); err != nil {
		closeAll(listeners)
		return nil, err
	}
	for i, ln := range listeners {
		inst, err := f.startInstance(i, ln, up, d.clock)
		if err != nil {
			closeAll(listeners[i:])
			return nil, err
		}
		f.instances = append(f.instances, inst)
	}
	f.watchKeys(d.hup)
	return f, nil
}

// loadKeys loads the keys every instance serves: the -keys file, through
// a reloader that keeps them in step with it, or the built-in demo keys.
func (f *fleet) loadKeys(clock ration.Clock) error {
	if f.cfg.keysFile == "" {
		kr, err := gateway.NewKeyring(gateway.DemoKeys())
		f.keys, f.demoKeys = kr, true
		return err
	}
	r, err := gateway.NewKeysReloader(f.cfg.keysFile, f.log, clock)
	if err != nil {
		return err
	}
	f.reloader, f.keys = r, r.Keys()
	f.log.Info("gateway-demo: keys loaded", "path", f.cfg.keysFile, "keys", f.keys.Current().Len(),
		"reload_interval", f.cfg.keysReload)
	return nil
}

// watchKeys reloads the keys file on each value from hup and, every
// cfg.keysReload, when its content changed, until stop. With the built-in
// keys there is nothing to reload: a SIGHUP is only logged.
func (f *fleet) watchKeys(hup <-chan os.Signal) {
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	f.stopWatch = func() { cancel(); <-done }
	go func() {
		defer close(done)
		if f.reloader != nil {
			f.reloader.Run(ctx, f.cfg.keysReload, hup)
			return
		}
		for {
			select {
			case <-ctx.Done():
				return
			case <-hup:
				f.log.Warn("gateway-demo: SIGHUP, but there is no keys file to reload: the built-in demo keys are in use (pass -keys FILE)")
			}
		}
	}()
}

// counter is the prompt tokenizer -tokenizer asks for; nil counts
// bytes/4. It calls the engine with client.
func (f *fleet) counter(client *http.Client) spenderhttp.Counter {
	switch f.cfg.tokenizer {
	case tokenizerBytes:
		return nil
	case tokenizerTiktoken:
		return f.tiktoken
	case tokenizerEngine:
		return f.engineCounter(client)
	}
	// auto: in-process for the OpenAI models tiktokencount knows, else the
	// engine's tokenizer if there is one, else bytes/4.
	if engine := f.engineCounter(client); engine != nil {
		return f.tiktoken.WithNext(engine)
	}
	return f.tiktoken
}

// tokenizerDesc says how prompts are counted, for the banner.
func (f *fleet) tokenizerDesc() string {
	engine := "bytes/4"
	if f.cfg.tokenize != "" {
		engine = strings.TrimSuffix(f.cfg.tokenize, "/") + "/v1/tokenize, else bytes/4"
	} else if f.engine != nil {
		engine = f.engineURL + "/v1/tokenize, else bytes/4"
	}
	switch f.cfg.tokenizer {
	case tokenizerBytes:
		return "bytes/4"
	case tokenizerTiktoken:
		return "in-process tiktoken for OpenAI models (gpt-4o, gpt-4, ...), else bytes/4"
	case tokenizerEngine:
		return engine
	}
	return "in-process tiktoken for OpenAI models (gpt-4o, gpt-4, ...), else " + engine
}

// engineCounter counts with -tokenize's /v1/tokenize, else the echo
// engine's; nil with -upstream and no -tokenize.
func (f *fleet) engineCounter(client *http.Client) spenderhttp.Counter {
	switch {
	case f.cfg.tokenize != "":
		return spenderhttp.TokenizeCounter{BaseURL: f.cfg.tokenize, Client: client}
	case f.engine != nil:
		return spenderhttp.TokenizeCounter{BaseURL: f.engineURL, Client: client}
	}
	return nil
}

func (f *fleet) startInstance(i int, ln net.Listener, up *url.URL, clock ration.Clock) (*instance, error) {
	log := f.log.With("instance", i+1)
	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	if f.reloader != nil {
		if err := f.reloader.Register(reg); err != nil { // every instance shows the keys it serves
			return nil, err
		}
	}
	lim, err := newLimiter(i, spenderID(f.spenderID, i), f.source, clock, reg, f.log)
	if err != nil {
		return nil, err
	}
	// One pool of connections to the engine per instance, for the proxy
	// and the tokenize call both.
	upstream := gateway.NewUpstreamTransport(f.cfg.upstreamConns)
	g, err := gateway.New(f.keys, lim, up, gateway.WithRegistry(reg), gateway.WithLogger(log),
		gateway.WithTransport(upstream), gateway.WithCounter(f.counter(&http.Client{Transport: upstream})),
		gateway.WithUpstreamKey(f.cfg.upstreamKey), gateway.WithAccessLog(f.cfg.accessLog),
		gateway.WithLimitOptions(spenderhttp.WithClock(clock), spenderhttp.WithMaxBodyBytes(f.cfg.maxBody),
			spenderhttp.WithMaxBodyBytesInFlight(f.cfg.maxInFlight)))
	if err != nil {
		_ = lim.Close(context.Background())
		return nil, err
	}
	inst := &instance{url: "http://" + ln.Addr().String(), limiter: lim, reg: reg, srv: newServer(g, f.cfg.limits, log), done: make(chan error, 1)}
	go func() { inst.done <- inst.srv.Serve(ln) }()
	log.Info("gateway-demo: instance listening", "url", inst.url)
	return inst, nil
}

// stop stops watching the keys file, stops the instances
// (stopInstances), then closes the allocator and the engine. It reports
// the failures but always does every step.
func (f *fleet) stop() error {
	if f.stopWatch != nil {
		f.stopWatch()
		f.stopWatch = nil
	}
	ctx, cancel := context.WithTimeout(context.Background(), f.cfg.drain+5*time.Second)
	defer cancel()
	errs := []error{f.stopInstances(ctx)}
	if f.source != nil && f.source.close != nil {
		if err := f.source.close(); err != nil {
			errs = append(errs, fmt.Errorf("closing the allocator: %w", err))
		}
	}
	if f.engine != nil {
		if err := f.engine.Shutdown(ctx); err != nil {
			f.engine.Close()
		}
	}
	if err := errors.Join(errs...); err != nil {
		return err
	}
	f.log.Info("gateway-demo: stopped; every lease returned", "instances", len(f.instances))
	return nil
}

// stopInstances drains every instance (in-flight requests get up to
// cfg.drain), then closes its Limiter, which returns its unspent leases to
// the allocator. Calling it again does nothing more.
func (f *fleet) stopInstances(ctx context.Context) error {
	var errs []error
	drainCtx, cancelDrain := context.WithTimeout(ctx, f.cfg.drain)
	defer cancelDrain()
	for _, inst := range f.instances {
		if err := inst.srv.Shutdown(drainCtx); err != nil {
			errs = append(errs, fmt.Errorf("draining %s: %w", inst.url, err))
			inst.srv.Close()
		}
	}
	for i, inst := range f.instances {
		if err := inst.limiter.Close(ctx); err != nil {
			errs = append(errs, fmt.Errorf("returning the leases of instance %d: %w", i+1, err))
		}
	}
	return errors.Join(errs...)
}

// newServer serves h over HTTP/1.1 and h2c, bounded by lim.
func newServer(h http.Handler, lim serverlimits.Limits, log *slog.Logger) *http.Server {
	p := new(http.Protocols)
	p.SetHTTP1(true)
	p.SetUnencryptedHTTP2(true)
	srv := &http.Server{Handler: h, Protocols: p, ErrorLog: slog.NewLogLogger(log.Handler(), slog.LevelWarn)}
	lim.Apply(srv)
	return srv
}

func listen(addr string) (net.Listener, error) {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("listening on %s: %w (pass -listen HOST:PORT for other ports)", addr, err)
	}
	return ln, nil
}

func closeAll(lns []net.Listener) {
	for _, ln := range lns {
		ln.Close()
	}
}
