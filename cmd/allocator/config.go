package main

import (
	"flag"
	"fmt"
	"io"
	"log/slog"
	"time"

	"github.com/rationhq/ration/allocator"
	"github.com/rationhq/ration/internal/envflag"
	"github.com/rationhq/ration/internal/serverlimits"
)

// config is everything cmd/allocator reads from flags and the environment.
// Each flag has an environment variable RATION_<FLAG> (upper case, dashes
// as underscores); a flag given on the command line wins.
type config struct {
	listen           string
	dataDir          string
	leaseTTL         time.Duration
	strict           bool
	tokenFile        string
	noAuth           bool
	tlsCert          string
	tlsKey           string
	sessionRetention time.Duration
	limitsFile       string
	quota            allocator.Quota
	commitLinger     time.Duration
	sweepInterval    time.Duration
	shutdownTimeout  time.Duration
	limits           serverlimits.Limits // per-connection timeouts and header cap
	logLevel         slog.Level
	logJSON          bool
	cluster          clusterFlags

	onCommit func() // tests: runs after every commit, before the replies go out
}

// defaultLimits are the allocator's per-connection bounds. Every call is
// unary and small, so the write timeout can be on.
var defaultLimits = serverlimits.Limits{
	ReadHeader:     10 * time.Second,
	Read:           30 * time.Second,
	Write:          30 * time.Second,
	Idle:           2 * time.Minute,
	MaxHeaderBytes: 64 << 10,
}

func parseConfig(args []string, getenv func(string) string, stderr io.Writer) (config, error) {
	var c config
	fs := flag.NewFlagSet("allocator", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.StringVar(&c.listen, "listen", "127.0.0.1:7450", "address to serve on (Connect, gRPC, gRPC-Web, /healthz, /readyz, /metrics)")
	fs.StringVar(&c.dataDir, "data-dir", "data", "directory of the bbolt store (allocator.db), or of a cluster member's raft log (raft.db) and snapshots (snapshots/)")
	fs.DurationVar(&c.leaseTTL, "lease-ttl", 10*time.Second, "lease time to live (1ms to 1h); enters the bound C + rho*(t+TTL)")
	fs.BoolVar(&c.strict, "strict", false, "strict mode: bound C + rho*t (holdings count against capacity)")
	fs.StringVar(&c.tokenFile, "token-file", "", "file of accepted bearer tokens, one per line (required unless -no-auth)")
	fs.BoolVar(&c.noAuth, "no-auth", false, "accept calls without a bearer token (development only)")
	fs.StringVar(&c.tlsCert, "tls-cert", "", "TLS certificate file (PEM); with -tls-key serves HTTPS, else h2c")
	fs.StringVar(&c.tlsKey, "tls-key", "", "TLS private key file (PEM)")
	fs.DurationVar(&c.commitLinger, "commit-linger", 8*time.Millisecond, "under concurrent load, the longest a group commit waits for more calls: until 64 wait, in 1 ms steps, and under light load only while each step brings a call (0: never)")
	fs.DurationVar(&c.sessionRetention, "session-retention", time.Hour, "how long a spender's exactly-once record outlives its last call")
	fs.StringVar(&c.limitsFile, "limits-file", "", "the gateways' keys file: the allocator holds every budget's limits from it, ignoring the limits calls carry, and refuses keys it does not list (none: calls' limits are followed)")
	fs.IntVar(&c.quota.Sessions, "max-sessions-per-credential", 4096, "spender ids each bearer token's calls may keep an exactly-once record for (0: no bound)")
	fs.IntVar(&c.quota.Keys, "max-keys-per-credential", 100_000, "keys each bearer token's calls may create, leases they may hold, and key answers they may keep for retries, each (0: no bound)")
	fs.DurationVar(&c.sweepInterval, "sweep-interval", 0, "how often idle keys and sessions are dropped; 0 = the lease TTL")
	fs.DurationVar(&c.shutdownTimeout, "shutdown-timeout", 15*time.Second, "on SIGTERM, how long to drain in-flight calls")
	c.limits = defaultLimits
	c.limits.Register(fs, "; calls are unary, so every reply is due well within it")
	level := fs.String("log-level", "info", "debug, info, warn or error")
	fs.BoolVar(&c.logJSON, "log-json", true, "log JSON lines (false: text)")
	c.cluster.register(fs)

	// Environment first, so that flags override it.
	if err := envflag.Parse(fs, "RATION_", getenv, args); err != nil {
		return c, err
	}
	if err := c.logLevel.UnmarshalText([]byte(*level)); err != nil {
		return c, fmt.Errorf("-log-level: %w", err)
	}
	switch {
	case c.tokenFile == "" && !c.noAuth:
		return c, fmt.Errorf("-token-file is required (or -no-auth for development)")
	case c.tokenFile != "" && c.noAuth:
		return c, fmt.Errorf("-token-file and -no-auth exclude each other")
	case (c.tlsCert == "") != (c.tlsKey == ""):
		return c, fmt.Errorf("-tls-cert and -tls-key go together")
	case c.commitLinger < 0 || c.commitLinger > 100*time.Millisecond:
		return c, fmt.Errorf("-commit-linger %v outside [0, 100ms]", c.commitLinger)
	case c.leaseTTL < time.Millisecond || c.leaseTTL > time.Hour:
		return c, fmt.Errorf("-lease-ttl %v outside [1ms, 1h]", c.leaseTTL)
	case c.quota.Sessions < 0 || c.quota.Keys < 0:
		return c, fmt.Errorf("-max-sessions-per-credential and -max-keys-per-credential must be 0 or more")
	}
	if err := c.limits.Validate(); err != nil {
		return c, err
	}
	if err := c.cluster.validate(c.tlsCert != ""); err != nil {
		return c, err
	}
	if c.sweepInterval <= 0 {
		c.sweepInterval = c.leaseTTL
	}
	return c, nil
}
