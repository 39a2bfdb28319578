package spender

import (
	"fmt"
	"log/slog"
	"net/http"
	"strings"

	"connectrpc.com/connect/v2"
	"connectrpc.com/connect/v2/connecthttp"

	"github.com/rationhq/ration"
	"github.com/rationhq/ration/proto/ration/lease/v1/leasev1connect"
)

// SourceOption configures DialAllocator.
type SourceOption interface {
	applySource(*sourceConfig) error
}

type sourceConfig struct {
	token    string
	client   *http.Client
	protocol connecthttp.Option
	metrics  *Metrics
	logger   *slog.Logger
}

type sourceOptionFunc func(*sourceConfig) error

func (f sourceOptionFunc) applySource(c *sourceConfig) error { return f(c) }

// WithToken authenticates every call with "Authorization: Bearer token".
// The default sends no token (an allocator with auth on answers
// Unauthenticated, which the Limiter treats as unreachable).
func WithToken(token string) SourceOption {
	return sourceOptionFunc(func(c *sourceConfig) error { c.token = token; return nil })
}

// WithTokenFile reads the bearer token from the first token of the file at
// path (see ration.ReadTokenFile: mode 600, one token a line, # comments).
func WithTokenFile(path string) SourceOption {
	return sourceOptionFunc(func(c *sourceConfig) error {
		tokens, err := ration.ReadTokenFile(path)
		if err != nil {
			return fmt.Errorf("spender: %w", err)
		}
		c.token = tokens[0]
		return nil
	})
}

// WithHTTPClient sets the HTTP client. The default speaks HTTP/2: over
// cleartext (prior knowledge, h2c) for an http:// URL, over TLS for https://.
// Its transport, cookie jar and timeout are used; its CheckRedirect is not:
// DialAllocator follows no redirect.
func WithHTTPClient(hc *http.Client) SourceOption {
	return sourceOptionFunc(func(c *sourceConfig) error { c.client = hc; return nil })
}

// WithProtocol selects the wire protocol: "connect" (the default), "grpc"
// or "grpcweb". The allocator serves all three.
func WithProtocol(name string) SourceOption {
	return sourceOptionFunc(func(c *sourceConfig) error {
		switch name {
		case "", "connect":
			c.protocol = nil
		case "grpc":
			c.protocol = connecthttp.WithGRPC()
		case "grpcweb":
			c.protocol = connecthttp.WithGRPCWeb()
		default:
			return fmt.Errorf("spender: unknown protocol %q (want connect, grpc or grpcweb)", name)
		}
		return nil
	})
}

// WithSourceMetrics records the source's leader redirects and the member
// it follows (leader_redirects_total, allocator_leader; see Metrics) into
// m, which is normally the Limiter's own (WithMetrics). The default
// records nothing.
func WithSourceMetrics(m *Metrics) SourceOption {
	return sourceOptionFunc(func(c *sourceConfig) error { c.metrics = m; return nil })
}

// WithSourceLogger sets where the source logs the member it follows and
// its changes (info), and a leader URL it will not follow because it is
// not in the list (warn). The default discards.
func WithSourceLogger(l *slog.Logger) SourceOption {
	return sourceOptionFunc(func(c *sourceConfig) error { c.logger = l; return nil })
}

// DialAllocator returns the LeaseSource of the allocator at baseURLs, for
// WithLeases: one base URL ("http://host:port" or "https://host:port"), or
// the members of an allocator cluster, comma-separated
// ("http://a:7450,http://b:7450,http://c:7450"; one scheme for all). It
// does not connect until the first call. Each call is bounded by the
// Limiter's call timeout and retried by the Limiter with backoff and
// jitter, with the same epoch, sequence and body, so that whichever member
// applies it applies it once.
//
// A call goes to the member that answered the previous one (the first
// listed, at the start). A member that is not the leader answers
// NOT_LEADER (ration.ReasonNotLeader) with the leader's URL: the source
// sends the same request there at once, in the same attempt, at most twice
// per attempt, and only to a listed member (compared by scheme, host and
// port; the bearer token goes to no other host, and an HTTP redirect is
// never followed: it fails the attempt). Otherwise (no leader
// named, a URL not in the list, a member that cannot be reached or does
// not answer within the attempt) the attempt fails with that error and
// the next one starts at the next member. While no member serves, the
// Limiter spends its leases and then applies its fallback policy, as when
// a lone allocator is down. With one URL nothing is redirected: a call
// goes to that allocator, and its answer is the call's.
func DialAllocator(baseURLs string, opts ...SourceOption) (LeaseSource, error) {
	bases, keys, err := parseMembers(baseURLs)
	if err != nil {
		return nil, err
	}
	var cfg sourceConfig
	for _, o := range opts {
		if err := o.applySource(&cfg); err != nil {
			return nil, err
		}
	}
	hc := cfg.client
	if hc == nil {
		p := new(http.Protocols)
		if strings.HasPrefix(keys[0], "http://") {
			p.SetUnencryptedHTTP2(true) // h2c only: with HTTP/1 also set, Go would pick HTTP/1.1
		} else {
			p.SetHTTP2(true)
		}
		hc = &http.Client{Transport: &http.Transport{Protocols: p}}
	}
	tr := hc.Transport
	if cfg.token != "" {
		if tr == nil {
			tr = http.DefaultTransport
		}
		tr = bearer{token: cfg.token, next: tr}
	}
	hc = &http.Client{Transport: tr, Jar: hc.Jar, Timeout: hc.Timeout, CheckRedirect: refuseRedirect}
	var topts []connecthttp.Option
	if cfg.protocol != nil {
		topts = append(topts, cfg.protocol)
	}
	f := &follower{index: make(map[string]int, len(keys)), metrics: cfg.metrics, log: cfg.logger, leader: -1}
	if f.log == nil {
		f.log = slog.New(slog.DiscardHandler)
	}
	for i, base := range bases {
		f.members = append(f.members, member{url: keys[i],
			client: leasev1connect.NewLeaseServiceClient(connect.NewClient(connecthttp.NewTransport(hc, base, topts...)))})
		f.index[keys[i]] = i
	}
	f.metrics.members(keys)
	return f, nil
}

// refuseRedirect is the client's CheckRedirect: an HTTP redirect is never
// followed. The bearer RoundTripper adds the token to every request, a
// redirected one included, so following one would send the token to a
// host nobody listed; a cluster names its leader in NOT_LEADER instead,
// which the follower checks against the list.
func refuseRedirect(r *http.Request, _ []*http.Request) error {
	return fmt.Errorf("spender: the allocator answered with a redirect to %s, which is not followed: the bearer token goes only to the listed allocator URLs", r.URL.Host)
}

// bearer adds the Authorization header to every request.
type bearer struct {
	token string
	next  http.RoundTripper
}

func (b bearer) RoundTrip(r *http.Request) (*http.Response, error) {
	r = r.Clone(r.Context())
	r.Header.Set("Authorization", "Bearer "+b.token)
	return b.next.RoundTrip(r)
}
