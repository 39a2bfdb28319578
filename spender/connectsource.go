package spender

import (
	"fmt"
	"net/http"
	"net/url"
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

// DialAllocator returns the LeaseSource of the allocator at baseURL, for
// WithLeases. It does not connect until the first call. Each call is
// bounded by the Limiter's call timeout and retried by the Limiter with
// backoff and jitter.
func DialAllocator(baseURL string, opts ...SourceOption) (LeaseSource, error) {
	u, err := url.Parse(baseURL)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return nil, fmt.Errorf("spender: allocator URL %q: want http://host:port or https://host:port", baseURL)
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
		if u.Scheme == "http" {
			p.SetUnencryptedHTTP2(true) // h2c only: with HTTP/1 also set, Go would pick HTTP/1.1
		} else {
			p.SetHTTP2(true)
		}
		hc = &http.Client{Transport: &http.Transport{Protocols: p}}
	}
	if cfg.token != "" {
		base := hc.Transport
		if base == nil {
			base = http.DefaultTransport
		}
		hc = &http.Client{Transport: bearer{token: cfg.token, next: base}, Timeout: hc.Timeout}
	}
	var topts []connecthttp.Option
	if cfg.protocol != nil {
		topts = append(topts, cfg.protocol)
	}
	return leasev1connect.NewLeaseServiceClient(connect.NewClient(connecthttp.NewTransport(hc, strings.TrimSuffix(baseURL, "/"), topts...))), nil
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
