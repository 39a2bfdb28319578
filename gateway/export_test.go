package gateway

import "net/http/httputil"

// NewCopyBuffers returns the proxy's buffer pool, so that BenchmarkUpstream
// can give a bare proxy the same one.
func NewCopyBuffers() httputil.BufferPool { return new(copyBuffers) }
