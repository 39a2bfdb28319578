package allocator

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"connectrpc.com/connect/v2"
	"connectrpc.com/connect/v2/connecthttp"
	leasev1 "github.com/rationhq/ration/proto/ration/lease/v1"
	"github.com/rationhq/ration/proto/ration/lease/v1/leasev1connect"
)

// Replies served through Mount come from a pool and are recycled once the
// HTTP handler returns: under concurrent calls of different sizes, over
// Connect, gRPC and gRPC-Web, with errors and retries (stored replies)
// interleaved, every caller must still get its own reply intact. Run with
// -race, this also checks that a block is not reused while connect still
// marshals it.
func TestMountRecyclesReplies(t *testing.T) {
	l := newLedger(t, newFakeClock())
	mux := http.NewServeMux()
	Mount(mux, NewService(l), BearerAuth([]string{"tok"}))
	srv := httptest.NewUnstartedServer(mux)
	srv.Config.Protocols = new(http.Protocols)
	srv.Config.Protocols.SetHTTP1(true)
	srv.Config.Protocols.SetUnencryptedHTTP2(true)
	srv.Start()
	defer srv.Close()

	for _, p := range []struct {
		name string
		opts []connecthttp.Option
	}{{"connect", nil}, {"grpc", []connecthttp.Option{connecthttp.WithGRPC()}}, {"grpcweb", []connecthttp.Option{connecthttp.WithGRPCWeb()}}} {
		t.Run(p.name, func(t *testing.T) {
			hp := new(http.Protocols)
			hp.SetUnencryptedHTTP2(true)
			hc := &http.Client{Transport: &http.Transport{Protocols: hp}}
			client := leasev1connect.NewLeaseServiceClient(connect.NewClient(connecthttp.NewTransport(hc, srv.URL, p.opts...)))
			var wg sync.WaitGroup
			for g := range 8 {
				wg.Go(func() {
					n := []int{1, 3, 17, 64, 300}[g%5] // 300: above the pooled size
					id := fmt.Sprintf("%s-%d", p.name, g)
					req := &leasev1.AcquireRequest{Caller: &leasev1.Caller{SpenderId: id, Epoch: 1}}
					for i := range n {
						req.Keys = append(req.Keys, &leasev1.KeyAcquire{Key: fmt.Sprintf("%s-k%d", id, i),
							Limits: &leasev1.Limits{Rpm: 1_000_000_000, Tpm: 1_000_000_000},
							Want:   &leasev1.Amount{Requests: int64(g + 1), Tokens: int64(1000*g + i)}})
					}
					for seq := uint64(1); seq <= 30; seq++ {
						req.Caller.Sequence = seq
						ctx, ci := connect.NewClientContext(ctx)
						ci.RequestHeader().Set("Authorization", "Bearer tok")
						if seq%7 == 0 { // unauthenticated: the interceptor fails the call
							ci.RequestHeader().Set("Authorization", "Bearer nope")
							if _, err := client.Acquire(ctx, req); connect.CodeOf(err) != connect.CodeUnauthenticated {
								t.Errorf("%s: bad token: %v", id, err)
							}
							continue
						}
						if seq%5 == 0 { // invalid: the service fails the call
							bad := &leasev1.AcquireRequest{Caller: req.Caller, Keys: append(req.Keys[:n:n], req.Keys[0])}
							if _, err := client.Acquire(ctx, bad); connect.CodeOf(err) != connect.CodeInvalidArgument {
								t.Errorf("%s: duplicate key: %v", id, err)
							}
							continue
						}
						for try := range 2 { // the second is a retry: the stored reply
							r, err := client.Acquire(ctx, req)
							if err != nil {
								t.Errorf("%s seq %d try %d: %v", id, seq, try, err)
								return
							}
							if len(r.GetKeys()) != n || r.GetLeaseTtlUs() != 10_000_000 {
								t.Errorf("%s seq %d: %d keys, ttl %d", id, seq, len(r.GetKeys()), r.GetLeaseTtlUs())
								return
							}
							for i, k := range r.GetKeys() {
								if k.GetStatus() != leasev1.GrantStatus_GRANT_STATUS_OK || k.GetGranted().GetRequests() != int64(g+1) ||
									k.GetGranted().GetTokens() != int64(1000*g+i) || k.GetSnapshot().GetTokens().GetLimit() != 1_000_000_000 ||
									k.GetActiveSpenders() != 1 {
									t.Errorf("%s seq %d key %d: %v", id, seq, i, k)
									return
								}
							}
						}
					}
				})
			}
			wg.Wait()
		})
	}
}

// A call that outlives its request (an interceptor that returns before the
// call it wraps) builds its reply after the handler has closed the holder:
// the reply is allocated, never recycled, and nothing races.
func TestMountDetachedCall(t *testing.T) {
	l := newLedger(t, newFakeClock())
	done := make(chan *leasev1.AcquireResponse, 1)
	var calls atomic.Int32
	detach := func(next connect.ServerFunc) connect.ServerFunc {
		return func(ctx context.Context, spec connect.Spec, stream connect.ServerStream) error {
			if calls.Add(1) > 1 {
				return next(ctx, spec, stream)
			}
			var req leasev1.AcquireRequest
			if err := stream.Receive(&req); err != nil {
				return err
			}
			go func() {
				time.Sleep(20 * time.Millisecond) // after the request is over
				r, err := NewService(l).Acquire(ctx, &req)
				if err != nil {
					t.Error(err)
				}
				done <- r
			}()
			return connect.NewError(connect.CodeUnavailable, "detached")
		}
	}
	mux := http.NewServeMux()
	Mount(mux, NewService(l), detach)
	srv := httptest.NewServer(mux)
	defer srv.Close()
	client := leasev1connect.NewLeaseServiceClient(connect.NewClient(connecthttp.NewTransport(srv.Client(), srv.URL)))
	req := &leasev1.AcquireRequest{Caller: &leasev1.Caller{SpenderId: "d", Epoch: 1, Sequence: 1},
		Keys: []*leasev1.KeyAcquire{{Key: "k", Limits: &leasev1.Limits{Tpm: 600}, Want: &leasev1.Amount{Tokens: 7}}}}
	if _, err := client.Acquire(ctx, req); connect.CodeOf(err) != connect.CodeUnavailable {
		t.Fatalf("detached call: %v", err)
	}
	r := <-done
	// Other calls reuse pooled blocks meanwhile; the detached reply is its own.
	for range 5 {
		req.Caller.Sequence++
		if _, err := client.Acquire(ctx, req); err != nil {
			t.Fatal(err)
		}
	}
	if g := r.GetKeys()[0].GetGranted().GetTokens(); g != 7 {
		t.Fatalf("detached reply granted %d, want 7", g)
	}
}
