// Package serverlimits holds the timeouts and header cap of an HTTP
// server, the flags that set them and their application to an
// *http.Server. The commands (cmd/allocator, cmd/gateway-demo, cmd/sidecar) share it
// so that each server is bounded the same way.
package serverlimits

import (
	"flag"
	"fmt"
	"net/http"
	"time"
)

// Limits bounds what one client connection may hold. A zero duration
// disables that timeout (net/http's meaning); MaxHeaderBytes must be
// positive.
type Limits struct {
	ReadHeader     time.Duration // request line and headers
	Read           time.Duration // the whole request, headers and body
	Write          time.Duration // from the end of the headers to the end of the response; 0 where responses stream
	Idle           time.Duration // a keep-alive connection between requests
	MaxHeaderBytes int           // request line and headers
}

// Unary is the default for a server whose calls are all unary and small
// (the allocator's lease API, the sidecar's): every reply is due well
// within the write timeout, so it can be on.
var Unary = Limits{
	ReadHeader:     10 * time.Second,
	Read:           30 * time.Second,
	Write:          30 * time.Second,
	Idle:           2 * time.Minute,
	MaxHeaderBytes: 64 << 10,
}

// Register defines the flags -read-header-timeout, -read-timeout,
// -write-timeout, -idle-timeout and -max-header-bytes on fs, with l as
// their defaults, writing into l. writeNote is appended to the
// -write-timeout usage (why its default is what it is).
func (l *Limits) Register(fs *flag.FlagSet, writeNote string) {
	fs.DurationVar(&l.ReadHeader, "read-header-timeout", l.ReadHeader, "longest a client may take to send a request's headers (0: no limit)")
	fs.DurationVar(&l.Read, "read-timeout", l.Read, "longest a client may take to send a whole request, headers and body; a slower body is cut (0: no limit)")
	fs.DurationVar(&l.Write, "write-timeout", l.Write, "longest from the end of a request's headers to the end of its response (0: no limit)"+writeNote)
	fs.DurationVar(&l.Idle, "idle-timeout", l.Idle, "how long a keep-alive connection may sit idle between requests before it is closed (0: no limit)")
	fs.IntVar(&l.MaxHeaderBytes, "max-header-bytes", l.MaxHeaderBytes, "largest request line and headers, in bytes")
}

// Validate reports a negative timeout or a header cap below 1 KiB.
func (l Limits) Validate() error {
	switch {
	case l.ReadHeader < 0 || l.Read < 0 || l.Write < 0 || l.Idle < 0:
		return fmt.Errorf("-read-header-timeout, -read-timeout, -write-timeout and -idle-timeout must not be negative")
	case l.MaxHeaderBytes < 1<<10:
		return fmt.Errorf("-max-header-bytes %d: want at least 1024", l.MaxHeaderBytes)
	}
	return nil
}

// Apply sets l on srv.
func (l Limits) Apply(srv *http.Server) {
	srv.ReadHeaderTimeout = l.ReadHeader
	srv.ReadTimeout = l.Read
	srv.WriteTimeout = l.Write
	srv.IdleTimeout = l.Idle
	srv.MaxHeaderBytes = l.MaxHeaderBytes
}
