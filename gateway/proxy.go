package gateway

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"net/http/httputil"
	"net/url"
	"strings"
	"sync"

	"github.com/rationhq/ration/internal/oaierror"
)

// statusClientClosed is nginx's "client closed request" status.
const statusClientClosed = 499

// ParseUpstream parses an engine's base URL: an absolute http or https
// URL such as "http://127.0.0.1:8000". A trailing "/v1" (how OpenAI
// clients are often configured) is dropped, since request paths already
// start with /v1. Errors wrap ErrBadUpstream.
func ParseUpstream(raw string) (*url.URL, error) {
	u, err := url.Parse(raw)
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrBadUpstream, err)
	}
	if (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return nil, fmt.Errorf("%w: %q: want http://host[:port] or https://host[:port]", ErrBadUpstream, raw)
	}
	u.Path = strings.TrimSuffix(strings.TrimSuffix(u.Path, "/"), "/v1")
	u.RawPath = ""
	return u, nil
}

// newProxy returns the reverse proxy to upstream. It streams: a response
// without a Content-Length (chunked: SSE, NDJSON) or of type
// text/event-stream is flushed on every write, so events reach the client
// as the engine sends them (httputil.ReverseProxy does this whatever
// FlushInterval says). A response of known length is not flushed write by
// write (FlushInterval 0): it goes out with its headers in one write, which
// flushing every write had split in two, at a cost in requests/s. The client's Authorization is never
// forwarded; upstreamKey, if not empty, is sent instead as a bearer
// token. Accept-Encoding is set to identity so the limit stage can read
// usage from the answer. An unreachable upstream is answered 502 in the
// OpenAI error shape; a client that left gets 499 and no body. The
// buffers that copy answers to clients are reused (copyBuffers), and a
// body the limit stage buffered is sent from memory.
func newProxy(upstream *url.URL, transport http.RoundTripper, upstreamKey string, logger *slog.Logger, onError func()) *httputil.ReverseProxy {
	return &httputil.ReverseProxy{
		Rewrite: func(pr *httputil.ProxyRequest) {
			pr.SetURL(upstream)
			pr.Out.Host = upstream.Host
			pr.Out.Header.Del("Authorization")
			if upstreamKey != "" {
				pr.Out.Header.Set("Authorization", "Bearer "+upstreamKey)
			}
			pr.Out.Header.Set("Accept-Encoding", "identity")
			pr.SetXForwarded()
			if pr.Out.Body != nil && pr.In.GetBody != nil {
				// The limit stage holds the body in memory (replayable
				// through GetBody). ReverseProxy wraps the body it is given
				// in a type net/http does not know, which makes the
				// transport send the headers and the body in two writes;
				// the body from GetBody goes out with the headers in one.
				if b, err := pr.In.GetBody(); err == nil {
					pr.Out.Body = b
				}
			}
		},
		Transport:     transport,
		FlushInterval: 0, // see above: streams still flush on every write
		BufferPool:    new(copyBuffers),
		ErrorLog:      slog.NewLogLogger(logger.Handler(), slog.LevelWarn),
		ErrorHandler: func(w http.ResponseWriter, r *http.Request, err error) {
			if errors.Is(err, context.Canceled) && r.Context().Err() != nil {
				w.WriteHeader(statusClientClosed)
				return
			}
			onError()
			logger.LogAttrs(r.Context(), slog.LevelWarn, "gateway: upstream failed",
				slog.String("path", r.URL.Path), slog.Any("err", err))
			oaierror.Write(w, http.StatusBadGateway, oaierror.TypeServer, "upstream_unavailable", "",
				"The inference engine behind this gateway did not answer; try again shortly.")
		},
	}
}

// copyBufferSize is the size of the buffer httputil.ReverseProxy copies an
// answer through: its own default.
const copyBufferSize = 32 << 10

// copyBuffers is the proxy's httputil.BufferPool. Without one the proxy
// allocates a fresh 32 KiB buffer for every answer, which was half of the
// gateway's allocated bytes per request and much of its collector's work.
type copyBuffers struct{ pool sync.Pool }

// Get returns a buffer of copyBufferSize bytes.
func (c *copyBuffers) Get() []byte {
	if b, ok := c.pool.Get().(*[]byte); ok {
		return *b
	}
	return make([]byte, copyBufferSize)
}

// Put keeps b for a later Get.
func (c *copyBuffers) Put(b []byte) {
	if cap(b) >= copyBufferSize {
		b = b[:copyBufferSize]
		c.pool.Put(&b)
	}
}
