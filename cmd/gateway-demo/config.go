package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"time"

	"github.com/rationhq/ration"
	"github.com/rationhq/ration/gateway"
	"github.com/rationhq/ration/internal/envflag"
	"github.com/rationhq/ration/internal/serverlimits"
	"github.com/rationhq/ration/spender"
	"github.com/rationhq/ration/spender/spenderhttp"
)

// maxInstances bounds --instances.
const maxInstances = 64

// minKeysReload is the shortest -keys-reload-interval but 0: each poll
// reads and hashes the whole file.
const minKeysReload = 10 * time.Millisecond

// maxUpstreamConns bounds --upstream-conns.
const maxUpstreamConns = 65536

// config is everything gateway-demo reads from flags and the environment.
// Each flag has an environment variable RATION_DEMO_<FLAG> (upper case,
// dashes as underscores); a flag on the command line wins.
type config struct {
	listen       string        // first instance's host:port; the others follow
	instances    int           // gateway instances, 1 to maxInstances
	keysFile     string        // "" = the built-in demo keys
	keysReload   time.Duration // how often to poll keysFile for a change; 0 = never (SIGHUP still reloads)
	dataDir      string        // the embedded allocator's directory
	upstream     string        // "" = the echo engine
	tokenizer    string        // how prompts are counted: auto, tiktoken, engine or bytes (see tokenizers)
	tokenize     string        // engine root whose /v1/tokenize counts prompts; "" = the echo engine's, if any
	allocatorURL string        // "" = embedded allocator; else one URL or a cluster's members, comma-separated
	tokenFile    string        // bearer token for the remote allocator
	leaseTTL     time.Duration // the embedded allocator's lease TTL
	echoDelay    time.Duration // echo engine: wait per streamed token
	drain        time.Duration // on shutdown, how long in-flight requests may take
	logLevel     slog.Level
	upstreamKey  string // RATION_DEMO_UPSTREAM_KEY only: never a flag, so it stays out of ps
	accessLog    bool   // log one line per request

	limits        serverlimits.Limits // every server's (gateways', echo engine's) per-connection bounds
	maxBody       int64               // largest request body a gateway reads
	maxInFlight   int64               // body bytes one gateway instance holds at once
	spenderID     string              // instance i's spender id is spenderID-(i+1); "" = defaultSpenderPrefix()
	upstreamConns int                 // idle connections to the engine each instance keeps for reuse
}

// defaultLimits are the gateway and echo servers' per-connection bounds.
// The write timeout is off: an SSE response lasts as long as the
// generation, and cutting it would lose tokens already charged.
var defaultLimits = serverlimits.Limits{
	ReadHeader:     10 * time.Second,
	Read:           60 * time.Second,
	Write:          0,
	Idle:           2 * time.Minute,
	MaxHeaderBytes: 64 << 10,
}

// defaultDataDir is where the embedded allocator keeps its store when
// --data is not given: the user's cache directory, else the temp dir.
func defaultDataDir() string {
	base, err := os.UserCacheDir()
	if err != nil {
		base = os.TempDir()
	}
	return filepath.Join(base, "ration", "gateway-demo")
}

// usage is -help's text before the flags.
const usage = `usage: gateway-demo [flags]

Runs an allocator (embedded, or -allocator), gateway instances on consecutive ports and the echo
engine (or -upstream), and prints API keys and curl lines to try (docs/gateway-demo.md).

Each flag may also come from the environment variable beside it; the command line wins.
RATION_DEMO_UPSTREAM_KEY (environment only, to stay out of ps) is sent to the upstream as its
bearer token.

flags:
`

// parseConfig reads the flags in args over the environment. With -help
// it writes the usage to help and returns flag.ErrHelp.
func parseConfig(args []string, getenv func(string) string, help io.Writer) (config, error) {
	var c config
	fs := flag.NewFlagSet("gateway-demo", flag.ContinueOnError)
	fs.StringVar(&c.listen, "listen", "127.0.0.1:8080", "address of the first gateway instance; instance i listens on port+i, the echo engine after the last (port 0: any free ports)")
	fs.IntVar(&c.instances, "instances", 3, fmt.Sprintf("gateway instances, 1 to %d", maxInstances))
	fs.StringVar(&c.keysFile, "keys", "", `API keys file: JSON [{"key","id","tenant","rpm","tpm"}], reloaded on SIGHUP and when its content changes (default: the built-in demo keys)`)
	fs.DurationVar(&c.keysReload, "keys-reload-interval", time.Second, "how often to check the -keys file's content and reload it when it changed (0: only on SIGHUP)")
	fs.StringVar(&c.dataDir, "data", defaultDataDir(), "data directory of the embedded allocator (its bbolt store, allocator.db)")
	fs.StringVar(&c.upstream, "upstream", "", "OpenAI-compatible engine to proxy to, e.g. http://127.0.0.1:8000 (vLLM), :8081 (llama.cpp), :11434 (Ollama); default: the built-in echo engine")
	fs.StringVar(&c.tokenizer, "tokenizer", "auto", "how prompts are counted: auto (in-process tiktoken for OpenAI models, else the engine's /v1/tokenize, else bytes/4), tiktoken (in-process, else bytes/4), engine (/v1/tokenize, else bytes/4) or bytes (bytes/4)")
	fs.StringVar(&c.tokenize, "tokenize", "", "engine root whose POST /v1/tokenize {model,text} counts prompt tokens (default: the echo engine; with -upstream, none: bytes/4)")
	fs.StringVar(&c.allocatorURL, "allocator", "", "URL of a remote allocator (cmd/allocator), e.g. http://127.0.0.1:7450, or of every member of an allocator cluster, comma-separated, e.g. http://a:7450,http://b:7450,http://c:7450 (calls go to the leader; one scheme for all); default: an embedded one")
	fs.StringVar(&c.tokenFile, "token-file", "", "file holding the bearer token for -allocator (the first token in it)")
	fs.DurationVar(&c.leaseTTL, "lease-ttl", 10*time.Second, "embedded allocator: lease time to live; enters the bound C + rate*(t + TTL)")
	fs.DurationVar(&c.echoDelay, "echo-delay", 0, "echo engine: wait before each streamed token (e.g. 50ms, to watch streaming)")
	fs.DurationVar(&c.drain, "drain", 10*time.Second, "on Ctrl-C, how long in-flight requests may take before they are cut")
	c.limits = defaultLimits
	c.limits.Register(fs, "; off by default: streamed (SSE) responses last as long as the generation")
	fs.Int64Var(&c.maxBody, "max-body-bytes", spenderhttp.DefaultMaxBodyBytes, "largest request body a gateway reads; larger is 413")
	fs.Int64Var(&c.maxInFlight, "max-body-in-flight", spenderhttp.DefaultMaxBodyBytesInFlight, "request body bytes one gateway instance holds at once; past it, 503 with Retry-After: 1")
	fs.StringVar(&c.spenderID, "spender-id", "", "prefix of the instances' spender ids at the allocator (instance i is PREFIX-i); unique per process: two processes on one allocator must not share it (default: gateway-demo/HOST/PID/RANDOM)")
	fs.IntVar(&c.upstreamConns, "upstream-conns", gateway.DefaultUpstreamConns, "idle connections to the engine each instance keeps for reuse (proxy and tokenize share them); at least the instance's client concurrency")
	level := fs.String("log-level", "info", "debug, info, warn or error")
	fs.BoolVar(&c.accessLog, "access-log", true, "log one line per request at info: method, path, the key's id (never the secret), status, bytes, duration, and admitted or the budget that refused it")

	if err := envflag.ParseHelp(fs, "RATION_DEMO_", getenv, args, help, usage); err != nil {
		return c, err
	}
	if err := c.logLevel.UnmarshalText([]byte(*level)); err != nil {
		return c, fmt.Errorf("-log-level: %w", err)
	}
	c.upstreamKey = getenv("RATION_DEMO_UPSTREAM_KEY")
	return c, c.validate()
}

func (c config) validate() error {
	switch {
	case c.instances < 1 || c.instances > maxInstances:
		return fmt.Errorf("-instances %d: want 1 to %d", c.instances, maxInstances)
	case c.tokenFile != "" && c.allocatorURL == "":
		return errors.New("-token-file is for -allocator; the embedded allocator needs no token")
	case c.allocatorURL != "" && c.tokenFile == "":
		return errors.New("-allocator needs -token-file (the allocator's bearer token)")
	case c.allocatorURL == "" && c.dataDir == "":
		return errors.New("-data must not be empty")
	case c.leaseTTL < time.Millisecond || c.leaseTTL > time.Hour:
		return fmt.Errorf("-lease-ttl %v: want 1ms to 1h", c.leaseTTL)
	case c.echoDelay < 0 || c.drain < 0:
		return errors.New("-echo-delay and -drain must not be negative")
	case c.keysReload < 0 || (c.keysReload > 0 && c.keysReload < minKeysReload):
		return fmt.Errorf("-keys-reload-interval %v: want 0 (off) or at least %v", c.keysReload, minKeysReload)
	case c.maxBody < 1 || c.maxInFlight < c.maxBody:
		return fmt.Errorf("-max-body-bytes %d, -max-body-in-flight %d: want 1 <= max-body-bytes <= max-body-in-flight", c.maxBody, c.maxInFlight)
	}
	if err := c.validateTokenizer(); err != nil {
		return err
	}
	if err := c.limits.Validate(); err != nil {
		return err
	}
	if c.upstreamConns < 1 || c.upstreamConns > maxUpstreamConns {
		return fmt.Errorf("-upstream-conns %d: want 1 to %d", c.upstreamConns, maxUpstreamConns)
	}
	if c.spenderID != "" {
		if err := ration.ValidSpenderID(spenderID(c.spenderID, c.instances-1)); err != nil {
			return fmt.Errorf("-spender-id %q: %w (instance %d's id)", c.spenderID, err, c.instances)
		}
	}
	if c.allocatorURL != "" {
		// DialAllocator checks the URL list and connects to nothing.
		if _, err := spender.DialAllocator(c.allocatorURL); err != nil {
			return fmt.Errorf("-allocator: %w", err)
		}
	}
	_, _, err := c.addrs()
	return err
}

// The -tokenizer values.
const (
	tokenizerAuto     = "auto"     // tiktoken for the models it knows, then the engine, then bytes/4
	tokenizerTiktoken = "tiktoken" // tiktoken, then bytes/4: no tokenize calls
	tokenizerEngine   = "engine"   // the engine's /v1/tokenize, then bytes/4
	tokenizerBytes    = "bytes"    // bytes/4
)

func (c config) validateTokenizer() error {
	switch c.tokenizer {
	case tokenizerAuto:
	case tokenizerEngine:
		if c.upstream != "" && c.tokenize == "" {
			return errors.New("-tokenizer engine with -upstream needs -tokenize URL: the engine root whose POST /v1/tokenize {model,text} counts prompts")
		}
	case tokenizerTiktoken, tokenizerBytes:
		if c.tokenize != "" {
			return fmt.Errorf("-tokenize is for -tokenizer auto or engine; -tokenizer %s calls no engine", c.tokenizer)
		}
	default:
		return fmt.Errorf("-tokenizer %q: want auto, tiktoken, engine or bytes", c.tokenizer)
	}
	return nil
}

// addrs returns the listen addresses of the instances and of the echo
// engine: consecutive ports from --listen, or all port 0.
func (c config) addrs() (gateways []string, echo string, err error) {
	host, portStr, err := net.SplitHostPort(c.listen)
	if err != nil {
		return nil, "", fmt.Errorf("-listen %q: %w", c.listen, err)
	}
	port, err := strconv.Atoi(portStr)
	if err != nil || port < 0 || port > 65535 {
		return nil, "", fmt.Errorf("-listen %q: bad port", c.listen)
	}
	at := func(i int) string {
		if port == 0 {
			return net.JoinHostPort(host, "0")
		}
		return net.JoinHostPort(host, strconv.Itoa(port+i))
	}
	if port != 0 && port+c.instances > 65535 {
		return nil, "", fmt.Errorf("-listen %q: %d instances and the engine do not fit below port 65536", c.listen, c.instances)
	}
	for i := range c.instances {
		gateways = append(gateways, at(i))
	}
	return gateways, at(c.instances), nil
}
