package allocator

import (
	"context"
	"slices"

	"connectrpc.com/connect/v2"
	"connectrpc.com/connect/v2/connecthttp"
	"github.com/rationhq/ration/proto/ration/lease/v1/leasev1connect"
)

// Mount serves the LeaseService h (usually a *Service) on mux at its
// procedure paths, for the Connect, gRPC and gRPC-Web protocols, behind
// the given server interceptors (first is outermost). cmd/allocator serves
// through it. A *Service also refuses, innermost and before reading its
// message, an Acquire or ReserveAhead of a credential at its quota
// (Ledger.AtQuota): ResourceExhausted, as the ledger would answer.
func Mount(mux connecthttp.ServeMux, h leasev1connect.LeaseServiceHandler, interceptors ...connect.ServerInterceptor) {
	if s, ok := h.(*Service); ok {
		interceptors = append(slices.Clip(interceptors), s.quotaGate)
	}
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

// quotaGate refuses an Acquire or a ReserveAhead of a credential whose
// last such call was refused for its quota (Ledger.AtQuota), before its
// message is read; a Release, which frees leases, goes through. A retry of
// an applied call is refused too, until a sweep part (a sixteenth of
// -sweep-interval) or a Release; retried then, it gets its stored reply.
func (s *Service) quotaGate(next connect.ServerFunc) connect.ServerFunc {
	return func(ctx context.Context, spec connect.Spec, stream connect.ServerStream) error {
		if spec.Procedure != leasev1connect.LeaseServiceReleaseProcedure && s.l.AtQuota(credentialOf(ctx)) {
			return connect.NewError(connect.CodeResourceExhausted,
				"allocator: this credential's last call was beyond its quota; calls are refused until a sweep or a Release frees some")
		}
		return next(ctx, spec, stream)
	}
}
