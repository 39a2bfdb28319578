package gateway

import (
	"net/http"
)

// DefaultUpstreamConns is how many idle connections to the upstream a
// gateway keeps for reuse by default: enough for 256 concurrent requests
// (each proxy call, and each tokenize call before it, holds one).
const DefaultUpstreamConns = 256

// NewUpstreamTransport returns a transport to the engine that keeps up to
// conns idle connections per host for reuse (at least 1). Size conns for
// the gateway's concurrency: http.DefaultTransport keeps 2 per host, so
// with 32 concurrent clients nearly every request opened a new connection
// and closed it again, leaving thousands of sockets in TIME_WAIT. The
// number of connections in use is not capped (a request never waits for
// one); conns bounds only how many are kept between requests. Otherwise
// it is http.DefaultTransport's configuration (proxy from the
// environment, dial and TLS timeouts, 90 s idle timeout).
func NewUpstreamTransport(conns int) *http.Transport {
	t := http.DefaultTransport.(*http.Transport).Clone()
	conns = max(conns, 1)
	t.MaxIdleConns = conns
	t.MaxIdleConnsPerHost = conns
	return t
}
