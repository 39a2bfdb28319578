package allocator

import (
	"context"
	"net/http"
	"sync"
	"sync/atomic"

	"connectrpc.com/connect/v2"
	"connectrpc.com/connect/v2/connecthttp"
	leasev1 "github.com/rationhq/ration/proto/ration/lease/v1"
	"github.com/rationhq/ration/proto/ration/lease/v1/leasev1connect"
)

// Mount serves the LeaseService h (a *Service, or a wrapper that forwards
// to one with the same context) on mux at its procedure paths, for the
// Connect, gRPC and gRPC-Web protocols, behind the given server
// interceptors (first is outermost). cmd/allocator serves through it.
//
// Each procedure's HTTP handler carries a reply holder in the request's
// context: an Acquire reply that a *Service builds while serving the
// request comes from a pool, and goes back to it once the procedure's
// HTTP handler has returned, that is once connect has marshaled and
// written it (all three protocols marshal the reply before the handler
// returns, errors included). A 64-key reply is ~28 KB of proto messages,
// so this saves an allocation of that size per call. The interceptors must
// therefore neither keep a reference to a response message after the call
// returns nor return before the call they wrap has (none of this package's
// do); a reply built after its request's handler has returned is not
// recycled. Replies of calls made outside Mount (in process, or through
// another mount) are never recycled.
func Mount(mux connecthttp.ServeMux, h leasev1connect.LeaseServiceHandler, interceptors ...connect.ServerInterceptor) {
	cs := connect.NewServer(interceptors...)
	leasev1connect.RegisterLeaseServiceHandler(cs, h)
	connecthttp.Mount(recyclingMux{mux}, cs, connecthttp.WithCompressMinBytes(compressMinBytes))
}

// compressMinBytes is the smallest reply Mount compresses (when the
// client accepts gzip; connect's default is to compress every reply).
// Below ~1 KB gzip saves a few bytes at best and often adds some, while
// each compression resets a ~600 KB flate state (tens of µs) and, whenever
// the GC has emptied connect's writer pool, allocates a new one: on the
// loopback benchmark a 1-key reply (~150 bytes) spent more CPU in gzip than
// in the allocator. A multi-key reply (~130 bytes a key) is still
// compressed.
const compressMinBytes = 1024

// recyclingMux wraps every handler connecthttp mounts with recycleReplies.
type recyclingMux struct{ mux connecthttp.ServeMux }

func (m recyclingMux) Handle(pattern string, h http.Handler) {
	m.mux.Handle(pattern, recycleReplies(h))
}

// replyHolderKey is the context key of the request's *replyHolder.
type replyHolderKey struct{}

// replyHolder is where a Service leaves the pooled reply of the request it
// served; the HTTP handler returns it to the pool when the request is done
// and closes the holder (holderClosed), so that a reply registered later
// (a call that outlived its request) is left to the GC instead.
type replyHolder struct {
	acquire atomic.Pointer[acquireBuf]
}

var holderClosed = new(acquireBuf) // sentinel

// register makes b the request's pooled reply; false if the holder is
// closed or already holds one (then b is the caller's to keep or drop).
func (hd *replyHolder) register(b *acquireBuf) bool { return hd.acquire.CompareAndSwap(nil, b) }

func recycleReplies(h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		hd := new(replyHolder) // not pooled: a context may outlive the request
		h.ServeHTTP(w, r.WithContext(context.WithValue(r.Context(), replyHolderKey{}, hd)))
		// ServeHTTP has returned: connect has written the reply (or an
		// error), and no longer refers to its messages.
		if b := hd.acquire.Swap(holderClosed); b != nil {
			putAcquireBuf(b)
		}
	})
}

// holderOf returns the request's reply holder, nil outside Mount.
func holderOf(ctx context.Context) *replyHolder {
	hd, _ := ctx.Value(replyHolderKey{}).(*replyHolder)
	return hd
}

// acquireBuf is one Acquire reply's proto messages, reused across calls.
type acquireBuf struct {
	resp   leasev1.AcquireResponse
	ptrs   []*leasev1.KeyGrant
	blocks []grantMsgs
}

// maxPooledKeys bounds the replies kept in the pool (in keys), so that a
// rare huge call does not pin its buffer.
const maxPooledKeys = 256

var acquireBufs sync.Pool // of *acquireBuf

func getAcquireBuf(n int) *acquireBuf {
	b, _ := acquireBufs.Get().(*acquireBuf)
	if b == nil {
		b = new(acquireBuf)
	}
	if cap(b.blocks) < n {
		b.blocks = make([]grantMsgs, n)
		b.ptrs = make([]*leasev1.KeyGrant, n)
	}
	b.blocks, b.ptrs = b.blocks[:n], b.ptrs[:n]
	return b
}

func putAcquireBuf(b *acquireBuf) {
	if cap(b.blocks) > maxPooledKeys {
		return
	}
	b.resp.Keys = nil
	acquireBufs.Put(b)
}
