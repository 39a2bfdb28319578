package sidecar_test

import (
	"context"
	"net/http"
	"path/filepath"
	"testing"

	"connectrpc.com/connect/v2"
	"connectrpc.com/connect/v2/connecthttp"
	"github.com/rationhq/ration/allocator"
	"github.com/rationhq/ration/internal/testkit"
	leasev1 "github.com/rationhq/ration/proto/ration/lease/v1"
	sidecarv1 "github.com/rationhq/ration/proto/ration/sidecar/v1"
	"github.com/rationhq/ration/proto/ration/sidecar/v1/sidecarv1connect"
	"github.com/rationhq/ration/sidecar"
	"github.com/rationhq/ration/spender"
)

// echo answers the reserve/settle API with fixed messages of the same
// shape as the sidecar's, doing nothing else: the cost of the RPC alone.
type echo struct{ res *sidecarv1.ReserveResponse }

func (e echo) Reserve(context.Context, *sidecarv1.ReserveRequest) (*sidecarv1.ReserveResponse, error) {
	return e.res, nil
}

func (echo) Settle(context.Context, *sidecarv1.SettleRequest) (*sidecarv1.SettleResponse, error) {
	return &sidecarv1.SettleResponse{}, nil
}

func (echo) Cancel(context.Context, *sidecarv1.CancelRequest) (*sidecarv1.CancelResponse, error) {
	return &sidecarv1.CancelResponse{}, nil
}

// BenchmarkReserveSettle is one request's Reserve and Settle over
// loopback (h2c, binary protobuf), on the sidecar (a leased Limiter whose
// lease covers the key, from an in-process allocator) and on a bare
// connect echo of the same messages. -count repeats each row before the
// next, so interleave runs of the rows (docs/performance.md):
//
//	go test -c -o /tmp/sidecar.test ./sidecar
//	for i in 1 2 3; do /tmp/sidecar.test -test.run '^$' -test.bench ReserveSettle -test.benchtime 3000x; done
func BenchmarkReserveSettle(b *testing.B) {
	req := &sidecarv1.ReserveRequest{Charges: []*sidecarv1.Charge{{Key: "bench-key",
		Limits: &leasev1.Limits{Rpm: 1_000_000_000, Tpm: 1_000_000_000}, Cost: &leasev1.Amount{Requests: 1, Tokens: 600}}}}
	usage := []*leasev1.Amount{{Requests: 1, Tokens: 212}}

	led, err := allocator.Open(filepath.Join(b.TempDir(), "allocator.db"))
	if err != nil {
		b.Fatal(err)
	}
	defer led.Close()
	lim := testkit.Limiter(b, nil, spender.WithLeases(allocator.NewService(led)))
	defer lim.Close(context.Background())
	svc, err := sidecar.New(lim)
	if err != nil {
		b.Fatal(err)
	}
	mux := http.NewServeMux()
	sidecar.Mount(mux, svc)
	sidecarURL := testkit.H2C(b, mux)
	client := func(url string) sidecarv1connect.ReservationServiceClient {
		return sidecarv1connect.NewReservationServiceClient(connect.NewClient(connecthttp.NewTransport(testkit.H2CClient(), url)))
	}
	real := client(sidecarURL)
	first, err := real.Reserve(context.Background(), req) // the echo answers with a real answer's shape
	if err != nil {
		b.Fatal(err)
	}
	emux := http.NewServeMux()
	ecs := connect.NewServer()
	sidecarv1connect.RegisterReservationServiceHandler(ecs, echo{res: first})
	connecthttp.Mount(emux, ecs)
	bare := client(testkit.H2C(b, emux))

	for _, c := range []struct {
		name string
		cl   sidecarv1connect.ReservationServiceClient
	}{{"echo", bare}, {"sidecar", real}} {
		b.Run(c.name, func(b *testing.B) {
			ctx := context.Background()
			cpu0 := testkit.CPUTime()
			for b.Loop() {
				r, err := c.cl.Reserve(ctx, req)
				if err != nil || r.Decision != sidecarv1.Decision_DECISION_ADMITTED {
					b.Fatal(r, err)
				}
				if _, err := c.cl.Settle(ctx, &sidecarv1.SettleRequest{ReservationId: r.ReservationId, Usage: usage}); err != nil {
					b.Fatal(err)
				}
			}
			// Client and server: CPU per pair, steadier than µs per pair
			// when other processes share the cores.
			b.ReportMetric(float64((testkit.CPUTime()-cpu0).Microseconds())/float64(b.N), "cpu-µs/op")
		})
	}
}
