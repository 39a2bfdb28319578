package allocator

import (
	"context"
	"slices"
	"sync"
	"sync/atomic"

	"connectrpc.com/connect/v2"
	"connectrpc.com/connect/v2/connecthttp"
	"github.com/rationhq/ration/proto/ration/lease/v1/leasev1connect"
)

// Mount serves the LeaseService h (a *Service, or a handler that
// forwards to one with the same context, as cmd/allocator's does) on mux
// at its procedure paths, for the Connect, gRPC and gRPC-Web protocols,
// behind the given server interceptors (first is outermost). cmd/allocator
// serves through it. Innermost, Mount adds two of its own:
//
//   - If h reports credentials at their quota (an AtQuota method, as a
//     *Service has), an Acquire or ReserveAhead of such a credential is
//     refused before its message is read: ResourceExhausted, as the ledger
//     would answer.
//   - An Acquire reply a *Service builds for the call comes from the
//     Service's pool and goes back to it once the call has returned, its
//     reply marshaled and written (see replyHolder). The interceptors given
//     must therefore keep no reference to a reply message after the call
//     returns (none of this package's do).
func Mount(mux connecthttp.ServeMux, h leasev1connect.LeaseServiceHandler, interceptors ...connect.ServerInterceptor) {
	interceptors = slices.Clip(interceptors)
	if q, ok := h.(quotaReporter); ok {
		interceptors = append(interceptors, quotaGate(q))
	}
	interceptors = append(interceptors, recycleReplies)
	cs := connect.NewServer(interceptors...)
	leasev1connect.RegisterLeaseServiceHandler(cs, h)
	connecthttp.Mount(mux, cs, connecthttp.WithCompressMinBytes(compressMinBytes))
}

// quotaReporter reports whether a credential's last Acquire or
// ReserveAhead was refused for its quota (Ledger.AtQuota).
type quotaReporter interface {
	AtQuota(credential string) bool
}

// compressMinBytes is the smallest reply Mount compresses (when the client
// accepts gzip; connect's default compresses every reply). Below ~1 KB
// gzip saves a few bytes at best, while each compression resets a ~600 KB
// flate state: a 1-key reply costs more CPU gzipped than the allocator's
// own work. Multi-key replies are still compressed.
const compressMinBytes = 1024

// quotaGate refuses an Acquire or a ReserveAhead of a credential whose
// last such call was refused for its quota (q.AtQuota), before its
// message is read; a Release, which frees leases, goes through. A retry of
// an applied call is refused too, until a sweep part (a sixteenth of
// -sweep-interval) or a Release; retried then, it gets its stored reply.
func quotaGate(q quotaReporter) connect.ServerInterceptor {
	return func(next connect.ServerFunc) connect.ServerFunc {
		return func(ctx context.Context, spec connect.Spec, stream connect.ServerStream) error {
			if spec.Procedure != leasev1connect.LeaseServiceReleaseProcedure && q.AtQuota(credentialOf(ctx)) {
				return connect.NewError(connect.CodeResourceExhausted,
					"allocator: this credential's last call was beyond its quota; calls are refused until a sweep or a Release frees some")
			}
			return next(ctx, spec, stream)
		}
	}
}

// replyHolder carries an Acquire reply built from a Service's pool from
// the Service, which leaves it here, to recycleReplies, which puts it back
// once the call has returned: connect marshals and writes a reply inside
// the call (stream.Send), for all three protocols, and keeps no reference
// to it after. A 64-key reply is some 30 KB of proto messages. A holder is
// closed once its call returned: a reply left after that (by a handler
// that let a call outlive its request) is the GC's.
type replyHolder struct {
	left atomic.Pointer[pooledReply]
}

// pooledReply is a reply buffer and the pool it goes back to.
type pooledReply struct {
	buf  *acquireBuf
	pool *sync.Pool
}

// holderClosed marks a closed holder. It is never modified.
var holderClosed = new(pooledReply)

// replyHolderKey is the context key of the call's *replyHolder.
type replyHolderKey struct{}

// holderOf returns the call's reply holder, nil outside Mount.
func holderOf(ctx context.Context) *replyHolder {
	hd, _ := ctx.Value(replyHolderKey{}).(*replyHolder)
	return hd
}

// leave hands p to the holder; false if it is closed or holds one already
// (then p stays the caller's).
func (hd *replyHolder) leave(p *pooledReply) bool { return hd.left.CompareAndSwap(nil, p) }

// recycleReplies gives each Acquire call a reply holder, and puts the
// reply left in it back into its pool once the call has returned.
func recycleReplies(next connect.ServerFunc) connect.ServerFunc {
	return func(ctx context.Context, spec connect.Spec, stream connect.ServerStream) error {
		if spec.Procedure != leasev1connect.LeaseServiceAcquireProcedure {
			return next(ctx, spec, stream)
		}
		hd := new(replyHolder) // not pooled: a context may outlive its call
		err := next(context.WithValue(ctx, replyHolderKey{}, hd), spec, stream)
		if p := hd.left.Swap(holderClosed); p != nil {
			p.pool.Put(p)
		}
		return err
	}
}
