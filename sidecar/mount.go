package sidecar

import (
	"context"

	"connectrpc.com/connect/v2"
	"connectrpc.com/connect/v2/connecthttp"
	"connectrpc.com/connect/v2/connectproto"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"github.com/rationhq/ration/proto/ration/sidecar/v1/sidecarv1connect"
)

// MaxMessageBytes caps one request message of either API: a Reserve, a
// Settle or a ShouldRateLimit is a few KiB at most.
const MaxMessageBytes = 1 << 20

// Mount serves s on mux: the reserve/settle API (ration.sidecar.v1
// ReservationService) and Envoy's rate limit service
// (envoy.service.ratelimit.v3 RateLimitService/ShouldRateLimit), each for
// the Connect, gRPC and gRPC-Web protocols, behind the given server
// interceptors (first is outermost). Envoy's service is registered from
// go-control-plane's message types and method descriptor: the same bytes
// on the wire as a generated gRPC server.
func Mount(mux connecthttp.ServeMux, s *Service, interceptors ...connect.ServerInterceptor) {
	cs := connect.NewServer(interceptors...)
	sidecarv1connect.RegisterReservationServiceHandler(cs, s)
	cs.Register(connect.Method{
		Spec: connect.Spec{
			StreamType: connect.StreamTypeUnary,
			Schema:     rlsv3.File_envoy_service_ratelimit_v3_rls_proto.Services().ByName("RateLimitService").Methods().ByName("ShouldRateLimit"),
			Procedure:  ShouldRateLimitProcedure,
		},
		Handler: func(ctx context.Context, _ connect.Spec, stream connect.ServerStream) error {
			var req rlsv3.RateLimitRequest
			if err := stream.Receive(&req); err != nil {
				return err
			}
			res, err := s.ShouldRateLimit(ctx, &req)
			if err != nil {
				return err
			}
			return stream.Send(res)
		},
	})
	// JSON with a field the message does not have is refused, not
	// ignored: a misspelt field (max_wait for max_wait_ms) would otherwise
	// change what is reserved without a word.
	strict := connectproto.NewJSONCodec()
	strict.UnmarshalOptions.DiscardUnknown = false
	connecthttp.Mount(mux, cs, connecthttp.WithReadMaxBytes(MaxMessageBytes),
		connecthttp.WithCodecs(connectproto.NewBinaryCodec(), strict))
}
