package allocator

import (
	"connectrpc.com/connect/v2"
	"connectrpc.com/connect/v2/connecthttp"
	"github.com/rationhq/ration/proto/ration/lease/v1/leasev1connect"
)

// Mount serves the LeaseService h (usually a *Service) on mux at its
// procedure paths, for the Connect, gRPC and gRPC-Web protocols, behind
// the given server interceptors (first is outermost). cmd/allocator serves
// through it.
func Mount(mux connecthttp.ServeMux, h leasev1connect.LeaseServiceHandler, interceptors ...connect.ServerInterceptor) {
	cs := connect.NewServer(interceptors...)
	leasev1connect.RegisterLeaseServiceHandler(cs, h)
	connecthttp.Mount(mux, cs, connecthttp.WithCompressMinBytes(compressMinBytes))
}

// compressMinBytes is the smallest reply Mount compresses (when the client
// accepts gzip; connect's default compresses every reply). Below ~1 KB
// gzip saves a few bytes at best, while each compression resets a ~600 KB
// flate state: a 1-key reply costs more CPU gzipped than the allocator's
// own work. Multi-key replies are still compressed.
const compressMinBytes = 1024
