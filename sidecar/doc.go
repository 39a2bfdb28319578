// Package sidecar serves ration's budgets to gateways that are not written
// in Go, over two APIs on one spender Limiter (cmd/sidecar runs it beside
// each gateway instance):
//
//   - Envoy's rate limit service (envoy.service.ratelimit.v3
//     RateLimitService/ShouldRateLimit) with envoyproxy/ratelimit's YAML
//     configuration (Config), so that a deployment swaps ratelimit and
//     Redis for ration by changing the service's address;
//   - the reserve/settle API (ration.sidecar.v1.ReservationService): Reserve
//     before calling the model, Settle with the usage (or Cancel) after.
//
// Both are served by Mount for the Connect, gRPC and gRPC-Web protocols.
//
// # Guarantees
//
//   - A request's budgets are charged all or nothing: a refusal charges
//     none of them, and says when the same request will be admitted (the
//     Limiter's exact wait; on leases, what the allocator last named).
//   - Each matched Envoy descriptor is a ration budget keyed by its domain
//     and entries ("rls/DOMAIN/k=v/..."): requests_per_unit per unit is a
//     token bucket of that capacity refilled over the unit, shared by every
//     sidecar and gateway of the allocator.
//   - A reservation is held until Settle or Cancel, or for the hold time,
//     after which it is settled at its reserved cost. Held reservations are
//     bounded (WithMaxOpen); their ids are 128 random bits.
//   - Bad input is INVALID_ARGUMENT with the reason and changes nothing;
//     no error is INTERNAL.
//
// # Caveats
//
//   - envoyproxy/ratelimit counts fixed windows (a burst of twice the limit
//     across a window's edge is possible there); ration's buckets refill
//     continuously, so the same configuration admits at most the limit in
//     any window of the unit's length, plus the lease bound.
//   - Units of a month or a year, and quota_mode, are refused at load.
//   - A stream-end call is told from a request-path call only by the
//     ration_settle entry (SettleEntry): without it, a stream-end call is an
//     ordinary, enforced call, and a refusal charges nothing.
package sidecar
