package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"strings"
	"time"

	"github.com/rationhq/ration"
	"github.com/rationhq/ration/internal/envflag"
	"github.com/rationhq/ration/internal/serverlimits"
	"github.com/rationhq/ration/sidecar"
	"github.com/rationhq/ration/spender"
)

// envPrefix prefixes the environment variable of each flag:
// RATION_SIDECAR_<FLAG>, upper case, dashes as underscores. A flag on the
// command line wins.
const envPrefix = "RATION_SIDECAR_"

// config is everything cmd/sidecar reads from flags and the environment.
type config struct {
	listen         string        // host:port, or unix:/path
	allocatorURL   string        // one URL or a cluster's members, comma-separated; "" with -embedded
	tokenFile      string        // the gateway credential for -allocator
	embedded       bool          // an in-process allocator
	dataDir        string        // the embedded allocator's directory
	leaseTTL       time.Duration // the embedded allocator's lease TTL
	rlsConfig      string        // envoyproxy/ratelimit YAML directory; "" = Envoy's API answers UNAVAILABLE
	rlsReload      time.Duration // how often to check rlsConfig for changes; 0 = only on SIGHUP
	hold           time.Duration
	maxOpen        int
	spenderID      string
	drain          time.Duration
	limits         serverlimits.Limits
	logLevel       slog.Level
	logJSON        bool
	unixSocketMode uint
}

// usage heads -help, before the flags and their environment variables.
const usage = `usage: sidecar (-allocator URL[,URL...] -token-file FILE | -embedded) [flags]

Serves, on one listener, Envoy's rate limit service (with -ratelimit-config), the reserve/settle
API for any language, /healthz, /readyz and /metrics, admitting from a leased Limiter
(docs/integrations.md). -version prints the build.

Each flag may also come from the environment variable beside it; the command line wins.

flags:
`

// parseConfig reads the flags and RATION_SIDECAR_* variables; -help writes
// the usage to help and returns flag.ErrHelp.
func parseConfig(args []string, getenv func(string) string, help io.Writer) (config, error) {
	var c config
	fs := flag.NewFlagSet("sidecar", flag.ContinueOnError)
	fs.StringVar(&c.listen, "listen", "127.0.0.1:7460", "address to serve on: HOST:PORT (keep it on loopback) or unix:/path/to/socket")
	fs.StringVar(&c.allocatorURL, "allocator", "", "the allocator's URL, or every member of an allocator cluster, comma-separated (http://a:7450,http://b:7450,http://c:7450)")
	fs.StringVar(&c.tokenFile, "token-file", "", "file holding the gateway bearer token for -allocator (the first token in it)")
	fs.BoolVar(&c.embedded, "embedded", false, "run an allocator in process, for one machine (its ledger in -data-dir), instead of -allocator")
	fs.StringVar(&c.dataDir, "data-dir", "ration-sidecar-data", "-embedded: directory of the allocator's bbolt store (allocator.db)")
	fs.DurationVar(&c.leaseTTL, "lease-ttl", 10*time.Second, "-embedded: lease time to live (1ms to 1h); enters the bound C + rho*(t+TTL)")
	fs.StringVar(&c.rlsConfig, "ratelimit-config", "", "directory of envoyproxy/ratelimit YAML files (*.yaml, *.yml) for Envoy's rate limit service; reloaded on SIGHUP and when they change")
	fs.DurationVar(&c.rlsReload, "ratelimit-config-reload-interval", 10*time.Second, "how often to check -ratelimit-config for changes (0: only on SIGHUP)")
	fs.DurationVar(&c.hold, "hold", sidecar.DefaultHold, "how long a reservation is held before it is settled at its reserved cost when nobody settles or cancels it (at most 24h)")
	fs.IntVar(&c.maxOpen, "max-open-reservations", sidecar.DefaultMaxOpen, "reservations held at once; past it, a Reserve is refused with UNAVAILABLE")
	fs.StringVar(&c.spenderID, "spender-id", "", "this sidecar's spender id at the allocator, unique per process (default: sidecar/HOST/PID/RANDOM)")
	fs.DurationVar(&c.drain, "drain", 10*time.Second, "on SIGTERM, how long in-flight calls may take")
	fs.UintVar(&c.unixSocketMode, "unix-socket-mode", 0o660, "permissions of the unix socket (-listen unix:...)")
	c.limits = serverlimits.Unary
	c.limits.Register(fs, "; calls are unary, so every reply is due well within it")
	level := fs.String("log-level", "info", "debug, info, warn or error")
	fs.BoolVar(&c.logJSON, "log-json", false, "log JSON lines (default: text)")
	if err := envflag.ParseHelp(fs, envPrefix, getenv, args, help, usage); err != nil {
		return c, err
	}
	if err := c.logLevel.UnmarshalText([]byte(*level)); err != nil {
		return c, fmt.Errorf("-log-level: %w", err)
	}
	return c, c.validate()
}

func (c config) validate() error {
	switch {
	case c.embedded == (c.allocatorURL != ""):
		return errors.New("give either -allocator URL (with -token-file) or -embedded")
	case c.allocatorURL != "" && c.tokenFile == "":
		return errors.New("-allocator needs -token-file (the gateway bearer token)")
	case c.embedded && c.tokenFile != "":
		return errors.New("-token-file is for -allocator; the embedded allocator needs no token")
	case c.embedded && c.dataDir == "":
		return errors.New("-data-dir must not be empty")
	case c.leaseTTL < time.Millisecond || c.leaseTTL > time.Hour:
		return fmt.Errorf("-lease-ttl %v: want 1ms to 1h", c.leaseTTL)
	case c.hold <= 0 || c.hold > 24*time.Hour:
		return fmt.Errorf("-hold %v: want more than 0 and at most 24h", c.hold)
	case c.maxOpen < 1:
		return fmt.Errorf("-max-open-reservations %d: want at least 1", c.maxOpen)
	case c.rlsReload < 0:
		return errors.New("-ratelimit-config-reload-interval must not be negative")
	case c.drain < 0:
		return errors.New("-drain must not be negative")
	case c.unixSocketMode > 0o777:
		return fmt.Errorf("-unix-socket-mode %o: want permission bits (0 to 0777)", c.unixSocketMode)
	case strings.HasPrefix(c.listen, "unix:") && len(c.listen) == len("unix:"):
		return errors.New("-listen unix: needs a path")
	}
	if c.spenderID != "" {
		if err := ration.ValidSpenderID(c.spenderID); err != nil {
			return fmt.Errorf("-spender-id: %w", err)
		}
	}
	if c.allocatorURL != "" {
		if _, err := spender.DialAllocator(c.allocatorURL); err != nil { // checks the URL list, connects to nothing
			return fmt.Errorf("-allocator: %w", err)
		}
	}
	return c.limits.Validate()
}
