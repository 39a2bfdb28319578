package allocator

import (
	"fmt"
	"net/http"
	"sync"
	"testing"

	"connectrpc.com/connect/v2"
	"connectrpc.com/connect/v2/connecthttp"
	"github.com/rationhq/ration/internal/testkit"
	leasev1 "github.com/rationhq/ration/proto/ration/lease/v1"
	"github.com/rationhq/ration/proto/ration/lease/v1/leasev1connect"
)

// Under concurrent calls of different sizes through Mount, over Connect,
// gRPC and gRPC-Web, with errors and retries (stored replies) interleaved,
// every caller gets its own reply intact.
func TestMountServesConcurrentCalls(t *testing.T) {
	l := newLedger(t, newFakeClock())
	mux := http.NewServeMux()
	Mount(mux, NewService(l), BearerAuth([]string{"tok"}, nil))
	url := testkit.H2C(t, mux)

	for _, p := range []struct {
		name string
		opts []connecthttp.Option
	}{{"connect", nil}, {"grpc", []connecthttp.Option{connecthttp.WithGRPC()}}, {"grpcweb", []connecthttp.Option{connecthttp.WithGRPCWeb()}}} {
		t.Run(p.name, func(t *testing.T) {
			client := leasev1connect.NewLeaseServiceClient(connect.NewClient(connecthttp.NewTransport(testkit.H2CClient(), url, p.opts...)))
			var wg sync.WaitGroup
			for g := range 8 {
				wg.Go(func() {
					n := []int{1, 3, 17, 64, 300}[g%5]
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
