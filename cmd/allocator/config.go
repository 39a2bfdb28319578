package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"strings"
	"time"

	"github.com/rationhq/ration/allocator/ledger"
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
	tokenFile        string // the gateways' tokens: the lease API only
	adminTokenFile   string // a cluster member's admin API (membership, backup, restore)
	peerTokenFile    string // a cluster member's raft peers
	noAuth           bool
	tlsCert          string
	tlsKey           string
	sessionRetention time.Duration
	limitsFile       string
	quota            ledger.Quota
	commitLinger     time.Duration
	sweepInterval    time.Duration
	shutdownTimeout  time.Duration
	limits           serverlimits.Limits // per-connection timeouts and header cap
	logLevel         slog.Level
	logJSON          bool
	cluster          clusterFlags

	onCommit func() // tests: runs after every commit, before the replies go out
}

// parseConfig reads the flags in args over the environment. With -help
// it writes the usage to help and returns flag.ErrHelp.
func parseConfig(args []string, getenv func(string) string, help io.Writer) (config, error) {
	var c config
	fs := flag.NewFlagSet("allocator", flag.ContinueOnError)
	fs.StringVar(&c.listen, "listen", "127.0.0.1:7450", "address to serve on (Connect, gRPC, gRPC-Web, /healthz, /readyz, /metrics)")
	fs.StringVar(&c.dataDir, "data-dir", "data", "directory of the bbolt store (allocator.db), or of a cluster member's raft log (raft.db) and snapshots (snapshots/)")
	fs.DurationVar(&c.leaseTTL, "lease-ttl", 10*time.Second, "lease time to live (1ms to 1h); enters the bound C + rho*(t+TTL)")
	fs.BoolVar(&c.strict, "strict", false, "strict mode: bound C + rho*t (holdings count against capacity)")
	fs.StringVar(&c.tokenFile, "token-file", "", "file of the gateways' bearer tokens, one per line: they open the lease API only (required unless -no-auth)")
	fs.StringVar(&c.adminTokenFile, "admin-token-file", "", "file of the admin API's bearer tokens (membership, backup, restore), one per line; a cluster member needs it unless -no-auth")
	fs.StringVar(&c.peerTokenFile, "peer-token-file", "", "file of the raft peers' shared secrets, one per line (the first is proven, any accepted); a cluster member needs it unless -no-auth or mutual TLS (-cluster-ca)")
	fs.BoolVar(&c.noAuth, "no-auth", false, "accept calls and peers without a credential (development only)")
	fs.StringVar(&c.tlsCert, "tls-cert", "", "TLS certificate file (PEM); with -tls-key serves HTTPS, else h2c")
	fs.StringVar(&c.tlsKey, "tls-key", "", "TLS private key file (PEM)")
	fs.DurationVar(&c.commitLinger, "commit-linger", 8*time.Millisecond, "under concurrent load, the longest a group commit waits for more calls: until 64 wait, in 1 ms steps, and under light load only while each step brings a call (0: never)")
	fs.DurationVar(&c.sessionRetention, "session-retention", time.Hour, "how long a spender's exactly-once record outlives its last call")
	fs.StringVar(&c.limitsFile, "limits-file", "", "the gateways' keys file: the allocator holds every budget's limits from it, ignoring the limits calls carry, and refuses keys it does not list (none: calls' limits are followed)")
	fs.IntVar(&c.quota.Sessions, "max-sessions-per-credential", 4096, "spender ids each bearer token's calls may keep an exactly-once record for (0: no bound)")
	fs.IntVar(&c.quota.Keys, "max-keys-per-credential", 100_000, "keys each bearer token's calls may create, leases they may hold, and key answers they may keep for retries, each (0: no bound)")
	fs.DurationVar(&c.sweepInterval, "sweep-interval", 0, "how often idle keys and sessions are dropped; 0 = the lease TTL")
	fs.DurationVar(&c.shutdownTimeout, "shutdown-timeout", 15*time.Second, "on SIGTERM, how long to drain in-flight calls")
	c.limits = serverlimits.Unary
	c.limits.Register(fs, "; calls are unary, so every reply is due well within it")
	level := fs.String("log-level", "info", "debug, info, warn or error")
	fs.BoolVar(&c.logJSON, "log-json", true, "log JSON lines (false: text)")
	c.cluster.register(fs)

	// Environment first, so that flags override it.
	if err := envflag.ParseHelp(fs, envPrefix, getenv, args, help, serverUsage); err != nil {
		return c, err
	}
	if err := c.logLevel.UnmarshalText([]byte(*level)); err != nil {
		return c, fmt.Errorf("-log-level: %w", err)
	}
	switch {
	case c.tokenFile == "" && !c.noAuth:
		return c, fmt.Errorf("-token-file is required (or -no-auth for development)")
	case c.noAuth && (c.tokenFile != "" || c.adminTokenFile != "" || c.peerTokenFile != ""):
		return c, fmt.Errorf("-no-auth excludes -token-file, -admin-token-file and -peer-token-file")
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
	if err := c.validateCredentials(); err != nil {
		return c, err
	}
	if c.sweepInterval <= 0 {
		c.sweepInterval = c.leaseTTL
	}
	return c, nil
}

// validateCredentials checks that each role has its credential: the
// admin API and raft exist only on a cluster member, and a member needs
// both, since the gateways' tokens open neither (docs/security.md).
func (c *config) validateCredentials() error {
	if !c.cluster.on() {
		if c.adminTokenFile != "" || c.peerTokenFile != "" {
			return errors.New("-admin-token-file and -peer-token-file need -cluster-id: the admin API and raft run only on a cluster member")
		}
		return nil
	}
	if c.noAuth {
		return nil
	}
	var missing []string
	if c.adminTokenFile == "" {
		missing = append(missing, "-admin-token-file")
	}
	if c.peerTokenFile == "" && c.cluster.ca == "" {
		missing = append(missing, "-peer-token-file (or mutual TLS with -cluster-ca)")
	}
	if len(missing) > 0 {
		return fmt.Errorf("a cluster member needs %s: -token-file is the gateways' credential and opens neither the admin API nor raft", strings.Join(missing, " and "))
	}
	return nil
}
